//! Formats written in two languages agree: the float tile the Blender
//! session's Python writes is the one `protocol::float_tile` reads.

use std::process::Command;

use tessera_protocol::float_tile::FloatTile;

use crate::requires::{require, Need};

#[test]
#[ignore = "needs python3"]
fn the_sessions_python_float_tile_writer_and_the_rust_reader_agree() {
    require(Need::Python3);
    let session = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("worker/src/engine/blender/session.py");
    let out = std::env::temp_dir().join(format!("tessera-tflt-{}.bin", std::process::id()));
    // Only `write_float_tile` is taken from the session (which needs bpy to
    // run): parsed with `ast`, compiled alone, called on known values.
    let script = r#"
import array, ast, os, struct, sys
path, out = sys.argv[1], sys.argv[2]
tree = ast.parse(open(path).read())
fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "write_float_tile")
ns = {"array": array, "os": os, "struct": struct, "sys": sys}
exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)
w, h = 3, 2
ns["write_float_tile"](out, w, h, 7, array.array("f", [i * 0.25 - 1.0 for i in range(w * h * 4)]))
"#;
    let run = Command::new("python3")
        .args(["-c", script])
        .arg(&session)
        .arg(&out)
        .output()
        .expect("python3 runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let tile = FloatTile::parse(&bytes).expect("a float tile");
    let expected = FloatTile {
        width: 3,
        height: 2,
        samples: 7,
        rgba: (0..24).map(|i| i as f32 * 0.25 - 1.0).collect(),
    };
    assert_eq!(tile, expected);
    assert_eq!(expected.encode(), bytes, "byte for byte what Rust writes");
}
