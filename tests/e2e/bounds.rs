//! Every number of a job spec has the same bounds over the HTTP API as on
//! the command line (issue 27): each numeric field at its bounds and one
//! past, posted to `POST /v1/jobs` and given to `tessera submit`; both
//! accept the same ones, and refuse the others with the same words.

use serde_json::{json, Value};

use crate::harness::{scenes, Farm};
use crate::hostile::ticket;
use crate::http_limits::{call, http_addr};

/// One value of one field: how the API gets it (a change to the spec's
/// JSON) and how the CLI does (submit's arguments, and the scene's
/// resolution when the field is one of the scene's).
struct Case {
    field: &'static str,
    value: String,
    json: Box<dyn Fn(&mut Value)>,
    /// None: the CLI has no way to give it (see `API_ONLY`).
    args: Option<Vec<String>>,
    accepted: bool,
}

fn case(
    field: &'static str,
    value: impl ToString,
    accepted: bool,
    args: &[&str],
    json: impl Fn(&mut Value) + 'static,
) -> Case {
    Case {
        field,
        value: value.to_string(),
        json: Box::new(json),
        args: Some(args.iter().map(|a| a.to_string()).collect()),
        accepted,
    }
}

fn cases() -> Vec<Case> {
    use tessera_protocol::job::limits::*;
    let mut cases = Vec::new();
    for (v, ok) in [
        (0u32, true),
        (MAX_VERIFY_PERCENT, true),
        (MAX_VERIFY_PERCENT + 1, false),
    ] {
        let arg = v.to_string();
        cases.push(case(
            "verify_percent",
            v,
            ok,
            &["--verify", &arg],
            move |s| s["verify_percent"] = json!(v),
        ));
    }
    for (v, ok) in [
        (0u32, false),
        (1, true),
        (MAX_SAMPLES, true),
        (MAX_SAMPLES + 1, false),
    ] {
        let arg = v.to_string();
        cases.push(case("samples", v, ok, &["--samples", &arg], move |s| {
            s["samples"] = json!(v)
        }));
    }
    for (v, ok) in [
        (0u32, false),
        (1, true),
        (MAX_TILES_PER_SIDE, true),
        (MAX_TILES_PER_SIDE + 1, false),
    ] {
        let (cols, rows) = (format!("{v}x1"), format!("1x{v}"));
        cases.push(case("tiles.cols", v, ok, &["--tiles", &cols], move |s| {
            s["tiles"] = json!({"cols": v, "rows": 1})
        }));
        cases.push(case("tiles.rows", v, ok, &["--tiles", &rows], move |s| {
            s["tiles"] = json!({"cols": 1, "rows": v})
        }));
    }
    // Sample ranges: 0 over the API is `auto` (the CLI's word for it).
    for (v, ok) in [
        (1u32, true),
        (MAX_SAMPLE_RANGES, true),
        (MAX_SAMPLE_RANGES + 1, false),
    ] {
        let arg = v.to_string();
        cases.push(case(
            "sample_ranges",
            v,
            ok,
            &["--sample-ranges", &arg, "--samples", "4096"],
            move |s| {
                s["sample_ranges"] = json!(v);
                s["samples"] = json!(4096);
            },
        ));
    }
    // More ranges than samples.
    cases.push(case(
        "sample_ranges",
        "samples + 1",
        false,
        &["--sample-ranges", "17", "--samples", "16"],
        |s| {
            s["sample_ranges"] = json!(17);
            s["samples"] = json!(16);
        },
    ));
    for (v, ok) in [
        (0u64, false),
        (1, true),
        (MAX_RESOLUTION as u64, true),
        (MAX_RESOLUTION as u64 + 1, false),
    ] {
        for side in [0usize, 1] {
            let mut c = case(
                ["resolution.width", "resolution.height"][side],
                v,
                ok,
                &[],
                move |s| s["resolution"][side] = json!(v),
            );
            c.args = None;
            cases.push(c);
        }
    }
    for v in [i32::MIN, i32::MAX] {
        let arg = format!("--priority={v}");
        cases.push(case("priority", v, true, &[&arg], move |s| {
            s["priority"] = json!(v)
        }));
    }
    for (ms, arg, ok) in [
        (MIN_TASK_TIMEOUT_MS - 1, "0.999s", false),
        (MIN_TASK_TIMEOUT_MS, "1s", true),
        (MAX_TASK_TIMEOUT_MS, "30d", true),
        (MAX_TASK_TIMEOUT_MS + 1000, "2592001s", false),
    ] {
        cases.push(case(
            "task_timeout_ms",
            ms,
            ok,
            &["--task-timeout", arg],
            move |s| s["task_timeout_ms"] = json!(ms),
        ));
    }
    for (usd, arg, ok) in [(-1.0, "-1", false), (0.0, "0", false), (0.01, "0.01", true)] {
        let arg = format!("--budget-usd={arg}");
        cases.push(case("budget.usd", usd, ok, &[&arg], move |s| {
            s["budget"] = json!({"usd": usd, "on_reached": "StopDispatch"})
        }));
    }
    // Frames: one past the most a job may have.
    let past = MAX_FRAMES as u32 + 1;
    let arg = format!("1-{past}");
    cases.push(case("frames", past, false, &["--frames", &arg], move |s| {
        s["frames"] = json!((1..=past).collect::<Vec<u32>>())
    }));
    // Tasks: frames x tiles x ranges past the most a job may have.
    cases.push(case(
        "tasks",
        "3 x 64x64 x 1024",
        false,
        &[
            "--frames",
            "1-3",
            "--tiles",
            "64x64",
            "--sample-ranges",
            "1024",
            "--samples",
            "1024",
        ],
        |s| {
            s["frames"] = json!([1, 2, 3]);
            s["tiles"] = json!({"cols": 64, "rows": 64});
            s["sample_ranges"] = json!(1024);
            s["samples"] = json!(1024);
        },
    ));
    cases
}

/// The numeric fields of a job spec the cases need not walk, and why.
const NOT_BOUNDED: &[(&str, &str)] = &[
    (
        "manifest",
        "sizes are checked against the stored files, not bounds",
    ),
    ("after", "job ids: checked to exist"),
    (
        "encode",
        "its `input` is a job id: checked to be one of `after`",
    ),
    (
        "deadline_unix_ms",
        "any time; the CLI gives it relative to now",
    ),
];

/// Numeric fields the CLI takes from elsewhere: their cases are posted to
/// the API only.
const API_ONLY: &[(&str, &str)] = &[(
    "resolution",
    "read from the scene, never an argument; a builtin scene's own format \
     allows at most 16384 per side, and says so itself",
)];

/// `error` with what both sides add around the same words taken off:
/// the CLI's own `error:` and what it adds after the words.
fn refusal(text: &str) -> String {
    text.trim().trim_start_matches("error: ").to_string()
}

#[test]
fn the_http_api_and_the_cli_refuse_the_same_numbers_with_the_same_words() {
    let farm = Farm::start("bounds", &["--http"]);
    let client = ticket(&farm, "client.ticket");
    let addr = http_addr(&farm);
    let scene = scenes().join("demo.scene.json");
    let base = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--paused",
        "--upload-only",
    ]);

    // Every numeric field of the spec is walked, or said not to be.
    let doc: Value = serde_json::from_str(tessera_coordinator::http::OPENAPI).unwrap();
    let props = doc["components"]["schemas"]["JobSpec"]["properties"]
        .as_object()
        .unwrap();
    let cases = cases();
    for (name, schema) in props {
        let text = schema.to_string();
        if !(text.contains("\"integer\"") || text.contains("\"number\"")) {
            continue;
        }
        let walked = cases
            .iter()
            .any(|c| c.field.split('.').next() == Some(name.as_str()));
        let excused = NOT_BOUNDED.iter().any(|(f, _)| f == name);
        assert!(
            walked || excused,
            "the numeric field `{name}` is not walked"
        );
    }

    let mut report = Vec::new();
    for c in &cases {
        let mut spec = base.clone();
        (c.json)(&mut spec);
        let (code, body) = call(&client, addr, "POST", "/v1/jobs", &spec.to_string());
        let api: Result<(), String> = match code {
            201 => Ok(()),
            400 => Err(json_error(&body)),
            other => panic!("{} = {}: HTTP {other}: {body}", c.field, c.value),
        };

        let Some(extra) = &c.args else {
            assert!(API_ONLY.iter().any(|(f, _)| c.field.starts_with(f)));
            assert_eq!(
                api.is_ok(),
                c.accepted,
                "{} = {}: {api:?}",
                c.field,
                c.value
            );
            report.push(format!("{} = {} (API only): {api:?}", c.field, c.value));
            continue;
        };
        let mut args = vec!["submit", scene.to_str().unwrap(), "--paused", "--json"];
        if !extra.iter().any(|a| a == "--frames") {
            args.extend(["--frames", "1"]);
        }
        args.extend(extra.iter().map(String::as_str));
        let out = farm.run(&args);
        let cli: Result<(), String> = if out.status.success() {
            Ok(())
        } else {
            Err(refusal(&String::from_utf8_lossy(&out.stderr)))
        };

        match (&api, &cli) {
            (Ok(()), Ok(())) => assert!(c.accepted, "{} = {} was accepted", c.field, c.value),
            (Err(a), Err(b)) => {
                assert!(!c.accepted, "{} = {} was refused: {a}", c.field, c.value);
                assert!(
                    b.contains(a.as_str()),
                    "{} = {}: the API said `{a}`, the CLI `{b}`",
                    c.field,
                    c.value
                );
            }
            _ => panic!(
                "{} = {}: the API said {api:?}, the CLI {cli:?}",
                c.field, c.value
            ),
        }
        report.push(format!(
            "{} = {}: {}",
            c.field,
            c.value,
            api.err().unwrap_or_else(|| "accepted".into())
        ));
    }
    println!("{}", report.join("\n"));
}

fn json_error(body: &str) -> String {
    let start = body.find('{').unwrap_or(0);
    let end = body.rfind('}').map_or(body.len(), |e| e + 1);
    let v: Value =
        serde_json::from_str(&body[start..end]).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["error"].as_str().unwrap().to_string()
}
