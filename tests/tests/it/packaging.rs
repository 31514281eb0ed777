//! What the packages ship besides the binary: man pages and shell
//! completions made by the real binary's hidden `generate` subcommand, the
//! examples in `--help`, and `packaging/config.toml`, whose commented keys
//! must be real keys with the real defaults.

use std::path::{Path, PathBuf};

use keysync_tests::binary::run_cli;
use salt_keysync::config::Config;

/// The subcommands `salt-keysync --help` lists (what operators can run),
/// read from the binary so that subcommands added later are covered too.
fn visible_subcommands() -> Vec<String> {
    let help = run_cli(&["--help"]);
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    let commands: Vec<String> = text
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect();
    for expected in ["run", "check", "certs"] {
        assert!(commands.iter().any(|c| c == expected), "{expected} missing from --help:\n{text}");
    }
    assert!(!commands.iter().any(|c| c == "generate"), "generate is hidden:\n{text}");
    commands
}

fn generate(args: &[&str]) {
    let out = run_cli(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn man_pages_cover_every_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man");
    generate(&["generate", "man", man.to_str().unwrap()]);
    let main_page = read(&man.join("salt-keysync.1"));
    assert!(main_page.contains(".TH salt-keysync 1"), "{main_page}");
    for sub in visible_subcommands() {
        assert!(main_page.contains(&format!("salt\\-keysync\\-{sub}(1)")), "{sub} not in salt-keysync.1:\n{main_page}");
        let page = read(&man.join(format!("salt-keysync-{sub}.1")));
        assert!(page.contains(&format!(".TH salt-keysync-{sub} 1")), "{page}");
    }
    assert!(!man.join("salt-keysync-generate.1").exists(), "the hidden subcommand gets no page");
    // The examples of `check` reach its page.
    assert!(read(&man.join("salt-keysync-check.1")).contains("Examples:"));
}

/// Every page has the sections a man page reader looks for, the examples
/// as written (one command per line, not reflowed into a paragraph), and
/// the files and exit statuses the binary really uses.
#[test]
fn man_pages_have_files_exit_status_examples_and_see_also() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man");
    generate(&["generate", "man", man.to_str().unwrap()]);
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&man).unwrap().map(|e| e.unwrap().path()).collect();
    pages.sort();
    assert!(pages.len() >= 12, "{pages:?}");
    for page in &pages {
        let text = read(page);
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXAMPLES", "FILES", "EXIT STATUS", "SEE ALSO"] {
            assert!(
                text.contains(&format!(".SH \"{section}\"")) || text.contains(&format!(".SH {section}\n")),
                "{}: no {section}:\n{text}",
                page.display()
            );
        }
        let examples = &text[text.find("EXAMPLES").unwrap()..];
        assert!(
            examples.contains("\n.nf\n") && examples.contains("\n.fi\n"),
            "{}: examples reflowed:\n{examples}",
            page.display()
        );
        for named in ["/etc/salt\\-keysync/config.toml", "/usr/share/doc/salt\\-keysync/recovery.md", "78"] {
            assert!(text.contains(named), "{}: {named} missing:\n{text}", page.display());
        }
    }
    let check = read(&man.join("salt-keysync-check.1"));
    let line =
        "  salt\\-keysync check \\-\\-config /etc/salt\\-keysync/config.toml && systemctl restart salt\\-keysync";
    assert!(check.lines().any(|l| l == line), "the example is not a line of its own:\n{check}");
    assert!(check.contains("\\fBsalt\\-keysync\\fR(1)"), "SEE ALSO names the main page:\n{check}");
}

#[test]
fn completions_offer_every_subcommand_and_not_the_hidden_one() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        generate(&["generate", "completions", shell, dir.path().to_str().unwrap()]);
    }
    let bash = read(&dir.path().join("salt-keysync.bash"));
    assert!(bash.contains("complete -F _salt__keysync"), "{bash}");
    let zsh = read(&dir.path().join("_salt-keysync"));
    let fish = read(&dir.path().join("salt-keysync.fish"));
    for sub in visible_subcommands() {
        assert!(bash.contains(&format!("salt__keysync,{sub})")), "bash: {sub}");
        assert!(zsh.contains(&format!("'{sub}:")), "zsh: {sub}");
        assert!(fish.contains(&format!("-a \"{sub}\"")), "fish: {sub}");
    }
    assert!(bash.contains("--config"), "the global option is completed");
    for script in [&bash, &zsh, &fish] {
        assert!(!script.contains("generate"), "hidden subcommand offered:\n{script}");
    }
}

/// `--version` names the release the packages carry (the workspace's
/// version: cargo-deb and cargo-generate-rpm take theirs from it) and the
/// replication protocols this build speaks; CHANGELOG.md has a section for
/// that release.
#[test]
fn version_names_the_release_and_its_protocols() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = read(&repo.join("Cargo.toml"));
    let release = manifest
        .split("[workspace.package]")
        .nth(1)
        .and_then(|table| table.lines().find_map(|line| line.strip_prefix("version = \"")))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("Cargo.toml's [workspace.package] has a version");
    let out = run_cli(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "salt-keysync {release} (protocol {}, oldest peer protocol {})\n",
            keysync_proto::PROTOCOL_VERSION,
            keysync_proto::MIN_PROTOCOL_VERSION
        )
    );
    let changelog = read(&repo.join("CHANGELOG.md"));
    assert!(changelog.contains(&format!("\n## [{release}]")), "CHANGELOG.md has no section for {release}");
}

#[test]
fn run_and_check_help_show_examples() {
    for sub in ["run", "check"] {
        let out = run_cli(&[sub, "--help"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("Examples:") && text.contains(&format!("salt-keysync {sub}")), "{sub} --help:\n{text}");
    }
}

fn example_config() -> (PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/config.toml");
    let text = read(&path);
    (path, text)
}

#[test]
fn example_config_documents_the_real_defaults() {
    let (path, text) = example_config();
    let as_shipped = Config::parse(&text, &path).unwrap_or_else(|e| panic!("{e}"));
    // Uncomment every `# key = value` line: each must be a known key whose
    // value is the default the agent uses when the key is absent.
    let uncommented: String = text
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if rest.split_once(" = ").is_some_and(|(key, _)| !key.contains(' ')) => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let n_uncommented = text.lines().count() - text.lines().zip(uncommented.lines()).filter(|(a, b)| a == b).count();
    assert!(n_uncommented >= 12, "only {n_uncommented} commented keys found");
    let explicit = Config::parse(&uncommented, &path).unwrap_or_else(|e| panic!("uncommented example: {e}"));
    let same =
        |what: &str, a: String, b: String| assert_eq!(a, b, "{what}: documented default differs from the real one");
    same("pki_dir", format!("{:?}", as_shipped.pki_dir), format!("{:?}", explicit.pki_dir));
    same("state_dir", format!("{:?}", as_shipped.state_dir), format!("{:?}", explicit.state_dir));
    same("listen", as_shipped.listen.to_string(), explicit.listen.to_string());
    same("log_format", format!("{:?}", as_shipped.log_format), format!("{:?}", explicit.log_format));
    same("mode", format!("{:?}", as_shipped.mode), format!("{:?}", explicit.mode));
    same("salt.key_mode", format!("{:?}", as_shipped.salt.key_mode), format!("{:?}", explicit.salt.key_mode));
    same(
        "salt.master_config",
        format!("{:?}", as_shipped.salt.master_config),
        format!("{:?}", explicit.salt.master_config),
    );
    same("salt.cachedir", format!("{:?}", as_shipped.salt.cachedir), format!("{:?}", explicit.salt.cachedir));
    same(
        "salt.version_command",
        format!("{:?}", as_shipped.salt.version_command),
        format!("{:?}", explicit.salt.version_command),
    );
    same("timings", format!("{:?}", as_shipped.timings), format!("{:?}", explicit.timings));
    same("guard", format!("{:?}", as_shipped.guard), format!("{:?}", explicit.guard));
    // master_id and user are examples (their defaults depend on the host).
    assert_eq!(explicit.salt.user.as_deref(), Some("salt"));
    assert_eq!(as_shipped.audit_log, Path::new("/var/log/salt-keysync/audit.jsonl"));
}

/// Every document a message or `--help` points to is installed by both
/// packages, and named where it is installed: an operator on a host has no
/// repository (`docs/recovery.md` there means nothing).
#[test]
fn every_document_the_binary_names_is_installed() {
    const DOC_DIR: &str = "/usr/share/doc/salt-keysync/";
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = read(&repo.join("agent/Cargo.toml"));
    let mut sources = Vec::new();
    let mut folders = vec![repo.join("agent/src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(path);
            }
        }
    }
    let mut named = std::collections::BTreeSet::new();
    for source in &sources {
        let text = read(source);
        // Not in comments: what the binary prints.
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for repo_path in ["docs/recovery.md", "see SECURITY.md", "(SECURITY.md"] {
                assert!(
                    !line.contains(repo_path),
                    "{}: names the repository's {repo_path}, not the installed {DOC_DIR}…: {line}",
                    source.display()
                );
            }
            for (at, _) in line.match_indices(DOC_DIR) {
                let rest = &line[at + DOC_DIR.len()..];
                let name: String =
                    rest.chars().take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')).collect();
                named.insert(name);
            }
        }
    }
    assert!(named.contains("recovery.md"), "no message names the installed recovery guide: {named:?}");
    for name in &named {
        let deb = format!("\"usr/share/doc/salt-keysync/{name}\"");
        let rpm = format!("dest = \"/usr/share/doc/salt-keysync/{name}\"");
        assert!(manifest.contains(&deb), "{name} is named by the binary but not in the .deb's assets");
        assert!(manifest.contains(&rpm), "{name} is named by the binary but not in the .rpm's assets");
    }
    // SECURITY.md ships too: the guarantees and the certificate procedures.
    for name in ["SECURITY.md", "recovery.md"] {
        assert!(manifest.contains(&format!("\"usr/share/doc/salt-keysync/{name}\"")), "{name}: not in the .deb");
        assert!(
            manifest.contains(&format!("dest = \"/usr/share/doc/salt-keysync/{name}\"")),
            "{name}: not in the .rpm"
        );
    }
}

/// The documents one package installs under /usr/share/doc/salt-keysync/, as
/// repository paths (`docs/operations.md`), read from agent/Cargo.toml: the
/// .deb's `["../SOURCE", "usr/share/doc/salt-keysync/…"` lines, or the .rpm's
/// `{ source = "SOURCE", dest = "/usr/share/doc/salt-keysync/…"` ones.
fn installed_documents(manifest: &str, rpm: bool) -> std::collections::BTreeSet<String> {
    manifest
        .lines()
        .filter(|line| line.contains("usr/share/doc/salt-keysync/"))
        .filter_map(|line| {
            let line = line.trim();
            let source = if rpm {
                line.strip_prefix("{ source = \"")?.split('"').next()?.to_string()
            } else {
                line.strip_prefix("[\"../")?.split('"').next()?.to_string()
            };
            source.ends_with(".md").then_some(source)
        })
        .collect()
}

/// `path` (relative to the repository) with `.` and `..` resolved.
fn normalized(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}

/// Issue 28 item 6: a document installed on a host links only to documents
/// installed beside it (docs/operations.md named docs/adopting.md, which
/// neither package shipped), and both packages ship the same documents.
#[test]
fn installed_documents_link_only_to_installed_documents() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = read(&repo.join("agent/Cargo.toml"));
    let deb = installed_documents(&manifest, false);
    let rpm = installed_documents(&manifest, true);
    assert!(deb.contains("README.md") && deb.contains("docs/operations.md"), "the .deb's documents: {deb:?}");
    assert_eq!(deb, rpm, "the .deb and the .rpm ship different documents");
    let mut missing = Vec::new();
    for doc in &deb {
        let text = read(&repo.join(doc));
        let folder = Path::new(doc).parent().unwrap_or(Path::new(""));
        for (at, _) in text.match_indices("](") {
            let target = &text[at + 2..];
            let target = &target[..target.find([')', '#']).unwrap_or(target.len())];
            if !target.ends_with(".md") || target.contains("://") {
                continue;
            }
            let linked = normalized(&folder.join(target));
            if !deb.contains(&linked) {
                missing.push(format!("{doc} links {linked}, which the packages do not install"));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}
