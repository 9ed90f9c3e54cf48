//! `GET /v1/status` and `GET /v1/jobs`: the jobs a filter keeps, all of
//! them or (`limit`, `offset`) one page, newest first.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Request, Response, StatusCode};
use serde_json::json;
use tessera_protocol::messages::JobStatus;

use super::{error, filter, not_a_number, ok_json, query, refused, Body};
use crate::server::Shared;
use crate::service::{self, off_runtime as off};

/// `limit=N&offset=K` of `GET /v1/jobs`: one page of the list, newest
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    limit: usize,
    offset: usize,
}

/// The most jobs one page of `GET /v1/jobs` holds, and how many it holds
/// when the query gives an offset alone.
const MAX_LIMIT: usize = 1000;
const DEFAULT_LIMIT: usize = 100;

/// The query's page, if it asks for one (an offset alone: 100 jobs): 400
/// for a limit out of 1..=1000, or either given twice.
fn window(pairs: &[(String, String)]) -> Result<Option<Window>, Response<Body>> {
    let (mut limit, mut offset) = (None, None);
    for (k, v) in pairs {
        let slot = match k.as_str() {
            "limit" => &mut limit,
            "offset" => &mut offset,
            _ => continue,
        };
        // At most u32::MAX, as the document says.
        let n: usize = (v.parse::<u32>().map(|n| n as usize)).map_err(|_| not_a_number(k, v))?;
        if slot.replace(n).is_some() {
            return Err(error(
                StatusCode::BAD_REQUEST,
                &format!("`{k}` is given twice"),
            ));
        }
    }
    match (limit, offset) {
        (None, None) => Ok(None),
        (Some(limit), offset) if (1..=MAX_LIMIT).contains(&limit) => Ok(Some(Window {
            limit,
            offset: offset.unwrap_or(0),
        })),
        (Some(limit), _) => Err(error(
            StatusCode::BAD_REQUEST,
            &format!("`limit={limit}`: expected 1 to {MAX_LIMIT}"),
        )),
        (None, Some(offset)) => Ok(Some(Window {
            limit: DEFAULT_LIMIT,
            offset,
        })),
    }
}

/// `GET /v1/status` (jobs and workers) and `GET /v1/jobs` (`jobs_only`):
/// every job the query's filter keeps, read a page at a time; with
/// `limit` (jobs only), one page of them, newest first.
pub(super) async fn list(
    shared: &Arc<Shared>,
    req: &Request<Incoming>,
    jobs_only: bool,
) -> Response<Body> {
    let pairs = query(req);
    let (f, window) = match (filter(&pairs), window(&pairs)) {
        (Ok(_), Ok(Some(_))) if !jobs_only => {
            return error(
                StatusCode::BAD_REQUEST,
                "`limit` and `offset` page GET /v1/jobs only",
            )
        }
        (Ok(f), Ok(w)) => (f, w),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    if let Some(w) = window {
        return match off(shared, move |s| {
            service::jobs_window(s, &f, w.offset, w.limit)
        })
        .await
        {
            Ok((page, total)) => {
                let mut r = ok_json(StatusCode::OK, &page);
                (r.headers_mut()).insert("x-total-count", HeaderValue::from(total));
                r
            }
            Err(e) => refused(&e),
        };
    }
    let mut jobs: Vec<JobStatus> = Vec::new();
    let mut after = 0;
    loop {
        let f = f.clone();
        match off(shared, move |s| service::jobs_page(s, &f, after)).await {
            Ok((page, next)) => {
                jobs.extend(page);
                match next {
                    Some(n) => after = n,
                    None => break,
                }
            }
            Err(e) => return refused(&e),
        }
    }
    if jobs_only {
        ok_json(StatusCode::OK, &jobs)
    } else {
        let workers = service::workers(shared);
        ok_json(StatusCode::OK, &json!({"jobs": jobs, "workers": workers}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_page_takes_a_limit_and_an_offset_within_bounds() {
        let q = |s: &str| -> Vec<(String, String)> {
            (s.split('&'))
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let status = |s: &str| window(&q(s)).err().map(|r| r.status().as_u16());
        assert_eq!(window(&q("state=done")).unwrap(), None);
        assert_eq!(
            window(&q("limit=50&offset=100")).unwrap(),
            Some(Window {
                limit: 50,
                offset: 100
            })
        );
        assert_eq!(window(&q("limit=1000")).unwrap().unwrap().offset, 0);
        assert_eq!(
            window(&q("offset=5")).unwrap().unwrap().limit,
            DEFAULT_LIMIT
        );
        for bad in [
            "limit=0",
            "limit=1001",
            "limit=x",
            "offset=-1",
            "limit=1&limit=2",
        ] {
            assert_eq!(status(bad), Some(400), "{bad}");
        }
    }
}
