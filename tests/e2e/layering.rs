//! The client side stops at the protocol: the client modules (submit,
//! status, wait, monitor) import nothing from the worker crate.

#[test]
fn the_client_modules_import_nothing_from_the_worker_crate() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![
        root.join("client.rs"),
        root.join("blend.rs"),
        root.join("report.rs"),
        root.join("progress.rs"),
        root.join("follow.rs"),
        root.join("exit.rs"),
        root.join("build.rs"),
        root.join("unpack.rs"),
        root.join("shown.rs"),
        root.join("uproject.rs"),
        root.join("share.rs"),
    ];
    for entry in std::fs::read_dir(root.join("monitor")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    let mut offending = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("tessera_worker") {
                offending.push(format!("{}:{}: {line}", file.display(), n + 1));
            }
        }
    }
    assert!(offending.is_empty(), "{}", offending.join("\n"));
}
