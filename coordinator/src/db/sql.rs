//! One way to speak SQL to the two databases the coordinator keeps its state
//! in: SQLite in the data dir (the default) and PostgreSQL (`--state
//! postgres://…`). A statement is written once, in SQL both accept, with
//! `?N` parameters (sent to PostgreSQL as `$N`); parameters and row values
//! are the five kinds of value both share ([`Value`]). Where the two differ
//! (the schema, `INDEXED BY`, checkpoints, backups) the caller asks
//! [`Sql::is_postgres`].
//!
//! Both clients are synchronous: like every database call, these run on
//! the blocking pool or the commit thread, never on a runtime thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tessera_protocol::Digest;

use super::DbError;

/// A parameter or a row's value: what SQLite and PostgreSQL share. Integers
/// are 64-bit in both (PostgreSQL columns are `BIGINT`).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(v.into())
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::Int(v.into())
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Int(v.into())
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Real(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(v.clone())
    }
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Value {
        Value::Blob(v.to_vec())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}

/// The parameters of a statement: `args![a, b]` is `[Value::from(a), …]`.
macro_rules! args {
    ($($v:expr),* $(,)?) => { [$($crate::db::sql::Value::from($v)),*] };
}
pub(crate) use args;

/// One row of a result, its values in column order.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(Vec<Value>);

impl Row {
    fn at(&self, i: usize) -> Result<&Value, DbError> {
        (self.0.get(i)).ok_or_else(|| DbError::Column(format!("no column {i}")))
    }

    fn wrong(&self, i: usize, want: &str) -> DbError {
        DbError::Column(format!("column {i} is {:?}, not {want}", self.0.get(i)))
    }

    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, DbError> {
        match self.at(i)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(*v)),
            _ => Err(self.wrong(i, "an integer")),
        }
    }

    pub fn int(&self, i: usize) -> Result<i64, DbError> {
        self.opt_int(i)?.ok_or_else(|| self.wrong(i, "an integer"))
    }

    /// An integer the coordinator wrote from a `u64` (`as i64`).
    pub fn u64(&self, i: usize) -> Result<u64, DbError> {
        Ok(self.int(i)? as u64)
    }

    pub fn u32(&self, i: usize) -> Result<u32, DbError> {
        u32::try_from(self.int(i)?).map_err(|_| self.wrong(i, "a u32"))
    }

    pub fn bool(&self, i: usize) -> Result<bool, DbError> {
        Ok(self.int(i)? != 0)
    }

    pub fn opt_real(&self, i: usize) -> Result<Option<f64>, DbError> {
        match self.at(i)? {
            Value::Null => Ok(None),
            Value::Real(v) => Ok(Some(*v)),
            Value::Int(v) => Ok(Some(*v as f64)),
            _ => Err(self.wrong(i, "a number")),
        }
    }

    pub fn real(&self, i: usize) -> Result<f64, DbError> {
        self.opt_real(i)?.ok_or_else(|| self.wrong(i, "a number"))
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, DbError> {
        match self.at(i)? {
            Value::Null => Ok(None),
            Value::Text(v) => Ok(Some(v.clone())),
            _ => Err(self.wrong(i, "text")),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, DbError> {
        self.opt_text(i)?.ok_or_else(|| self.wrong(i, "text"))
    }

    pub fn blob(&self, i: usize) -> Result<Vec<u8>, DbError> {
        match self.at(i)? {
            Value::Blob(v) => Ok(v.clone()),
            _ => Err(self.wrong(i, "bytes")),
        }
    }

    /// A digest stored as hex text.
    pub fn digest(&self, i: usize) -> Result<Digest, DbError> {
        (self.text(i)?.parse()).map_err(|e| DbError::Column(format!("column {i}: {e}")))
    }
}

/// A connection to the state's database.
pub enum Sql {
    Sqlite(rusqlite::Connection),
    Postgres(Box<Pg>),
}

/// A PostgreSQL connection with the statements it prepared. A connection
/// the server closed (a restart, a failover, a network cut) is made again
/// by the next statement, which waits for the server up to
/// [`RECONNECT_PATIENCE`]; the statement that found it closed fails.
pub struct Pg {
    config: postgres::Config,
    /// The connection string without its password, for messages.
    shown: String,
    client: RefCell<Option<postgres::Client>>,
    statements: RefCell<HashMap<String, postgres::Statement>>,
    /// When connecting last failed, for a second of failing at once.
    failed: std::cell::Cell<Option<Instant>>,
    /// Inside a transaction a closed connection is an error, never made
    /// again: the rest of the transaction must not run outside it.
    in_transaction: std::cell::Cell<bool>,
}

/// How long a statement that finds its connection closed tries to connect
/// again before it fails.
pub const RECONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// How long what was sent to PostgreSQL may go unacknowledged (and an idle
/// connection unanswered by keepalives) before the connection counts as
/// closed. A server cut off by the network sends no reset: without this a
/// statement on its connection waits out the system's TCP retransmissions
/// (about 15 minutes on Linux), holding the commit thread, and a result a
/// worker sent meanwhile is neither accepted nor refused.
pub const DEAD_AFTER: Duration = Duration::from_secs(5);

/// Past this many prepared statements the cache starts again (the ones
/// built from a job filter vary).
const MAX_PREPARED: usize = 256;

impl Sql {
    /// Connects to PostgreSQL at `url` (`postgres://user@host:port/db`;
    /// a password not in it is taken from `PGPASSWORD`).
    pub fn postgres(url: &str) -> Result<Sql, DbError> {
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e| DbError::Connect(format!("{}: {e}", redact(url))))?;
        if config.get_password().is_none() {
            if let Ok(p) = std::env::var("PGPASSWORD") {
                config.password(p);
            }
        }
        config.application_name("tessera-coordinator");
        config.connect_timeout(Duration::from_secs(5));
        config.tcp_user_timeout(DEAD_AFTER);
        config.keepalives_idle(DEAD_AFTER);
        let pg = Pg {
            config,
            shown: redact(url),
            client: RefCell::new(None),
            statements: RefCell::new(HashMap::new()),
            failed: std::cell::Cell::new(None),
            in_transaction: std::cell::Cell::new(false),
        };
        // The first connection is not waited for: a wrong URL, database
        // or user is said at once.
        let client = (pg.config.connect(postgres::NoTls))
            .map_err(|e| DbError::Connect(format!("{}: {}", pg.shown, chain(&e))))?;
        *pg.client.borrow_mut() = Some(client);
        Ok(Sql::Postgres(Box::new(pg)))
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Sql::Postgres(_))
    }

    /// Runs one statement; returns how many rows it changed.
    pub fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        match self {
            Sql::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                Ok(stmt.execute(rusqlite::params_from_iter(params))? as u64)
            }
            Sql::Postgres(pg) => {
                let stmt = pg.prepare(sql)?;
                Ok(pg.client()?.execute(&stmt, &pg_params(params))?)
            }
        }
    }

    /// Every row `sql` selects.
    pub fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        match self {
            Sql::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let columns = stmt.column_count();
                let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
                let mut out = Vec::new();
                while let Some(row) = rows.next()? {
                    let values = (0..columns)
                        .map(|i| row.get_ref(i).map(sqlite_value))
                        .collect::<Result<_, _>>()?;
                    out.push(Row(values));
                }
                Ok(out)
            }
            Sql::Postgres(pg) => {
                let run = || -> Result<Vec<Row>, DbError> {
                    let stmt = pg.prepare(sql)?;
                    let rows = pg.client()?.query(&stmt, &pg_params(params))?;
                    rows.iter().map(pg_row).collect()
                };
                match run() {
                    // A read the server's restart cut off is read again on
                    // a new connection (a write is not: it may have run).
                    Err(e) if e.is_unreachable() && !pg.in_transaction.get() && is_read(sql) => {
                        pg.disconnect();
                        run()
                    }
                    answer => answer,
                }
            }
        }
    }

    /// The first row `sql` selects, if any.
    pub fn query_opt(&self, sql: &str, params: &[Value]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// The first row `sql` selects (one it always selects: a `COUNT`).
    pub fn query_one(&self, sql: &str, params: &[Value]) -> Result<Row, DbError> {
        (self.query_opt(sql, params)?).ok_or_else(|| DbError::Column(format!("no row from {sql}")))
    }

    /// Statements without parameters, run in order (a schema).
    pub fn batch(&self, sql: &str) -> Result<(), DbError> {
        match self {
            Sql::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Sql::Postgres(pg) => Ok(pg.client()?.batch_execute(sql)?),
        }
    }

    /// Runs `f` in a transaction: committed when it returns `Ok`, rolled
    /// back when it returns an error or panics.
    pub fn transaction<T>(&self, f: impl FnOnce(&Sql) -> Result<T, DbError>) -> Result<T, DbError> {
        self.batch("BEGIN")?;
        self.set_in_transaction(true);
        let mut open = Open(Some(self));
        let value = f(self)?;
        open.0 = None;
        let committed = self.batch("COMMIT");
        self.set_in_transaction(false);
        committed.map(|()| value)
    }

    fn set_in_transaction(&self, on: bool) {
        if let Sql::Postgres(pg) = self {
            pg.in_transaction.set(on);
        }
    }

    /// The SQLite connection, for what only SQLite has (pragmas,
    /// checkpoints); `None` on PostgreSQL.
    pub fn sqlite(&self) -> Option<&rusqlite::Connection> {
        match self {
            Sql::Sqlite(c) => Some(c),
            Sql::Postgres(_) => None,
        }
    }
}

/// A transaction not yet committed: rolled back when dropped.
struct Open<'a>(Option<&'a Sql>);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if let Some(sql) = self.0 {
            if let Err(e) = sql.batch("ROLLBACK") {
                tracing::error!("cannot roll a transaction back: {e}");
            }
            sql.set_in_transaction(false);
        }
    }
}

/// The connection, borrowed for one call.
type Borrowed<'a> = std::cell::RefMut<'a, postgres::Client>;

impl Pg {
    /// Connects when there is no open connection: tries for up to
    /// [`RECONNECT_PATIENCE`] (a server restarting takes a second or two);
    /// for a second after that failed, a statement fails at once.
    fn connected(&self) -> Result<(), DbError> {
        let mut client = self.client.borrow_mut();
        if client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        if self.in_transaction.get() {
            return Err(DbError::Connect(format!(
                "{}: the connection closed in a transaction",
                self.shown
            )));
        }
        if client.take().is_some() {
            tracing::warn!(
                "the connection to PostgreSQL ({}) closed: connecting again",
                self.shown
            );
        }
        // Statements belong to the connection that prepared them.
        self.statements.borrow_mut().clear();
        let began = Instant::now();
        if self
            .failed
            .get()
            .is_some_and(|t| began - t < Duration::from_secs(1))
        {
            return Err(DbError::Connect(format!("{}: not connected", self.shown)));
        }
        let mut wait = Duration::from_millis(50);
        loop {
            match self.config.connect(postgres::NoTls) {
                Ok(fresh) => {
                    self.failed.set(None);
                    *client = Some(fresh);
                    return Ok(());
                }
                Err(e) if began.elapsed() >= RECONNECT_PATIENCE => {
                    self.failed.set(Some(Instant::now()));
                    return Err(DbError::Connect(format!("{}: {}", self.shown, chain(&e))));
                }
                Err(_) => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// Drops the connection: the next statement connects again.
    fn disconnect(&self) {
        *self.client.borrow_mut() = None;
    }

    fn client(&self) -> Result<Borrowed<'_>, DbError> {
        self.connected()?;
        Ok(std::cell::RefMut::map(self.client.borrow_mut(), |c| {
            c.as_mut().expect("just connected")
        }))
    }

    fn prepare(&self, sql: &str) -> Result<postgres::Statement, DbError> {
        self.connected()?;
        if let Some(s) = self.statements.borrow().get(sql) {
            return Ok(s.clone());
        }
        let stmt = self.client()?.prepare(&dollar_params(sql))?;
        let mut cache = self.statements.borrow_mut();
        if cache.len() >= MAX_PREPARED {
            cache.clear();
        }
        cache.insert(sql.to_string(), stmt.clone());
        Ok(stmt)
    }
}

impl Drop for Pg {
    /// The synchronous client closes its connection on a runtime of its
    /// own, which cannot start on a runtime thread (where the coordinator's
    /// last reference may be dropped at shutdown): it is closed on a thread
    /// of its own.
    fn drop(&mut self) {
        if let Some(client) = self.client.get_mut().take() {
            let _ = std::thread::spawn(move || drop(client)).join();
        }
    }
}

/// A PostgreSQL error with its causes (its own text is often only "db
/// error" or "error connecting to server").
pub(crate) fn chain(e: &postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

/// True for a statement that only reads.
fn is_read(sql: &str) -> bool {
    let head = sql.trim_start().get(..6).unwrap_or("");
    head.eq_ignore_ascii_case("select")
}

/// `?N` as PostgreSQL writes it: `$N`. (No statement here has a `?` in a
/// string literal.)
fn dollar_params(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// `url` without its password, for messages: in a URL's user info, or as
/// `password=…` in the key=value form.
pub(crate) fn redact(url: &str) -> String {
    let mut out = url.to_string();
    // postgres://USER:PASSWORD@HOST…
    if let (Some(s), Some(at)) = (out.find("://"), out.rfind('@')) {
        if at > s {
            if let Some(colon) = out[s + 3..at].find(':') {
                out.replace_range(s + 3 + colon + 1..at, "***");
            }
        }
    }
    mask_password_values(&out)
}

/// `password=VALUE` masked wherever it is: the key=value form (spaces
/// around `=`, a quoted value with escapes) or a URL's query.
fn mask_password_values(s: &str) -> String {
    let lower = s.to_ascii_lowercase();
    let bytes = s.as_bytes();
    let skip_spaces = |mut j: usize| {
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        j
    };
    let (mut out, mut i) = (String::new(), 0);
    while let Some(found) = lower[i..].find("password") {
        let key_end = i + found + "password".len();
        let j = skip_spaces(key_end);
        if bytes.get(j) != Some(&b'=') {
            out.push_str(&s[i..key_end]);
            i = key_end;
            continue;
        }
        let j = skip_spaces(j + 1);
        let mut end = if bytes.get(j) == Some(&b'\'') {
            let mut k = j + 1;
            while k < bytes.len() && bytes[k] != b'\'' {
                k += if bytes[k] == b'\\' { 2 } else { 1 };
            }
            (k + 1).min(bytes.len())
        } else {
            s[j..].find([' ', '&']).map_or(s.len(), |n| j + n)
        };
        while !s.is_char_boundary(end) {
            end += 1;
        }
        out.push_str(&s[i..j]);
        out.push_str("***");
        i = end;
    }
    out.push_str(&s[i..]);
    out
}

fn pg_params(params: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

fn sqlite_value(v: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

fn pg_row(row: &postgres::Row) -> Result<Row, DbError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let ty = column.type_();
        let value = if *ty == Type::INT8 {
            row.try_get::<_, Option<i64>>(i)?.into()
        } else if *ty == Type::INT4 {
            row.try_get::<_, Option<i32>>(i)?.into()
        } else if *ty == Type::INT2 {
            row.try_get::<_, Option<i16>>(i)?.map(i64::from).into()
        } else if *ty == Type::BOOL {
            row.try_get::<_, Option<bool>>(i)?.into()
        } else if *ty == Type::FLOAT8 {
            row.try_get::<_, Option<f64>>(i)?.into()
        } else if *ty == Type::FLOAT4 {
            row.try_get::<_, Option<f32>>(i)?.map(f64::from).into()
        } else if *ty == Type::BYTEA {
            match row.try_get::<_, Option<Vec<u8>>>(i)? {
                Some(b) => Value::Blob(b),
                None => Value::Null,
            }
        } else if [Type::TEXT, Type::VARCHAR, Type::NAME, Type::BPCHAR].contains(ty) {
            row.try_get::<_, Option<String>>(i)?.into()
        } else {
            return Err(DbError::Column(format!(
                "column {} has the type {ty}, which the coordinator does not read",
                column.name()
            )));
        };
        values.push(value);
    }
    Ok(Row(values))
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Real(r) => ValueRef::Real(*r),
            Value::Text(t) => ValueRef::Text(t.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl ToSql for Value {
    /// Written as the parameter's type asks: an integer into an `INTEGER`
    /// or `BOOLEAN` parameter too (the schema's columns are `BIGINT`).
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(v) if *ty == Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
            Value::Int(v) if *ty == Type::INT2 => i16::try_from(*v)?.to_sql(ty, out),
            Value::Int(v) if *ty == Type::BOOL => (*v != 0).to_sql(ty, out),
            Value::Int(v) if *ty == Type::FLOAT8 => (*v as f64).to_sql(ty, out),
            Value::Int(v) => v.to_sql(ty, out),
            Value::Real(v) => v.to_sql(ty, out),
            Value::Text(t) => t.as_str().to_sql(ty, out),
            Value::Blob(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_as_postgres_numbers_them() {
        assert_eq!(
            dollar_params("SELECT a FROM t WHERE b = ?1 AND (?2 IS NULL OR c = ?2) LIMIT ?10"),
            "SELECT a FROM t WHERE b = $1 AND ($2 IS NULL OR c = $2) LIMIT $10"
        );
    }

    #[test]
    fn a_password_is_never_shown() {
        assert_eq!(
            redact("host=db user=bob password=hunter2 dbname=farm"),
            "host=db user=bob password=*** dbname=farm"
        );
        assert_eq!(
            redact("postgres://tessera:hunter2@db:5432/farm"),
            "postgres://tessera:***@db:5432/farm"
        );
        assert_eq!(
            redact("postgres://tessera@db/farm"),
            "postgres://tessera@db/farm"
        );
        // The forms the adversary probe found shown in full.
        assert_eq!(
            redact("host=db dbname=x password = LeakMe4"),
            "host=db dbname=x password = ***"
        );
        assert_eq!(
            redact("host=db password='Leak \\' Me3' dbname=x"),
            "host=db password=*** dbname=x"
        );
        assert_eq!(
            redact("postgres://db/farm?user=u&PASSWORD=hunter2&sslmode=off"),
            "postgres://db/farm?user=u&PASSWORD=***&sslmode=off"
        );
        assert_eq!(redact("password='unterminated é"), "password=***");
        assert_eq!(redact("passwordless=1 x"), "passwordless=1 x");
    }

    #[test]
    fn a_transaction_that_fails_leaves_nothing() {
        let sql = Sql::Sqlite(rusqlite::Connection::open_in_memory().unwrap());
        sql.batch("CREATE TABLE t (v INTEGER)").unwrap();
        let failed: Result<(), DbError> = sql.transaction(|tx| {
            tx.execute("INSERT INTO t (v) VALUES (?1)", &args![1i64])?;
            Err(DbError::Column("no".into()))
        });
        assert!(failed.is_err());
        sql.transaction(|tx| tx.execute("INSERT INTO t (v) VALUES (?1)", &args![2i64]))
            .unwrap();
        let rows = sql.query("SELECT v FROM t", &[]).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].int(0).unwrap(), 2);
    }
}
