//! `keysync-bench --layout`: each agent runs in a mount namespace of its own
//! where its folders are mounted as the packaged unit mounts them (pki_dir one
//! bind mount). The agent's own /proc/<pid>/mountinfo shows the mounts; the
//! benchmark's does not.

use keysync_bench::cluster::{BenchCluster, Layout};

/// The mount points under `root` that process `pid` sees.
fn mount_points(pid: &str, root: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let mut points: Vec<String> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(root.to_str().unwrap()))
        .map(|point| point.strip_prefix(root.to_str().unwrap()).unwrap().to_string())
        .collect();
    points.sort();
    points
}

#[test]
fn each_layout_mounts_what_the_unit_mounts_and_only_for_the_agent() {
    for (layout, want) in [(Layout::Unit, vec!["/pki", "/state"]), (Layout::Plain, vec![])] {
        let mut settings = keysync_bench::Settings::quick();
        settings.layout = layout;
        let mut cluster = BenchCluster::new(&settings, "layout").expect("the agents' files");
        cluster.start(0).expect("agent 0 starts");
        let dir = cluster.files[0].dir.clone();
        let pid = cluster.pid(0).unwrap().to_string();
        assert_eq!(mount_points(&pid, &dir), want, "{layout:?}");
        assert!(mount_points("self", &dir).is_empty(), "{layout:?}: the mounts leaked out of the agent's namespace");
        cluster.stop().expect("a clean stop");
    }
}
