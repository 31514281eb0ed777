//! The key-acceptance settings as the agent reads them agree with what real
//! Salt (3008.3 and 3006.28) makes of the same master configs: YAML 1.1
//! booleans, `master.d/` overriding the main file, `root_dir` put in front
//! of paths. Salt's own `salt.config.master_config()` is the reference.

use std::path::Path;
use std::process::Command;

use keysync_tests::salt;
use salt_keysync::disk::accept::SigningSource;
use salt_keysync::disk::health::local_health;

/// Writes `files` (path relative to `dir` → text) under `dir`.
fn write_all(dir: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
}

#[test]
fn accept_settings_match_what_salt_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("yaml11", vec![("master", "auto_accept: yes\nopen_mode: on\n".into())]),
        ("no", vec![("master", "auto_accept: no\nopen_mode: False\n".into())]),
        ("quoted", vec![("master", "auto_accept: \"True\"\n".into())]),
        ("include", vec![("master", "auto_accept: False\n".into()), ("master.d/a.conf", "auto_accept: True\n".into())]),
        (
            "rooted",
            vec![
                (
                    "master",
                    format!(
                        "root_dir: {d}/rooted/root\nautosign_file: /etc/salt/autosign.conf\nautosign_grains_dir: grains\n\
                         autoreject_file: {d}/rooted/root/reject.conf\n"
                    ),
                ),
                ("root/etc/salt/autosign.conf", "web*\n".into()),
                ("root/grains/uuid", "8f7d\n".into()),
                ("root/reject.conf", "# none\n".into()),
            ],
        ),
        ("relative", vec![("master", "autosign_file: nowhere-keysync-test.conf\n".into())]),
    ];
    for (name, files) in &cases {
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
        write_all(&dir.path().join(name), &files);
    }
    let script = r#"
import json, os, sys, salt.config
out = {}
for name in sys.argv[1:]:
    o = salt.config.master_config(os.path.join(name, "master"))
    path = lambda key: o.get(key) if o.get(key) and os.path.exists(o.get(key)) else None
    out[os.path.basename(name)] = {
        "auto_accept": o["auto_accept"], "open_mode": o["open_mode"],
        "autosign_file": path("autosign_file"), "autosign_grains_dir": path("autosign_grains_dir"),
        "autoreject_file": path("autoreject_file"),
    }
print(json.dumps(out))
"#;
    for version in salt::VERSIONS {
        let out = Command::new(salt::tool(version, "python"))
            .arg("-c")
            .arg(script)
            .args(cases.iter().map(|(name, _)| dir.path().join(name)))
            .output()
            .unwrap();
        assert!(out.status.success(), "Salt {version}: {}", String::from_utf8_lossy(&out.stderr));
        let salt_says: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for (name, _) in &cases {
            let health = local_health(dir.path(), &dir.path().join(name).join("master"));
            let ours = health.accept.unwrap_or_else(|| panic!("{name}: {:?}", health.errors));
            let theirs = &salt_says[name];
            let what = format!("Salt {version}, case {name}: ours {ours:?}, Salt's {theirs}");
            assert_eq!(theirs["auto_accept"], ours.auto_accept, "{what}");
            assert_eq!(theirs["open_mode"], ours.open_mode, "{what}");
            for (key, source) in [
                ("autosign_file", &ours.autosign_file),
                ("autosign_grains_dir", &ours.autosign_grains_dir),
                ("autoreject_file", &ours.autoreject_file),
            ] {
                let present = matches!(source, SigningSource::Present { .. });
                assert_eq!(theirs[key].is_string(), present, "{key}: {what}");
            }
        }
    }
}
