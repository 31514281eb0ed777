//! Users and owners as /etc/passwd and the file system name them.

use std::io;
use std::path::Path;

/// The name /etc/passwd gives `uid`, if any.
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd_entries(&passwd).into_iter().find(|(_, found, _)| *found == Some(uid)).map(|(name, _, _)| name.to_string())
}

/// The entries of an /etc/passwd: name, uid and gid (`None` where a number
/// does not parse).
fn passwd_entries(passwd: &str) -> Vec<(&str, Option<u32>, Option<u32>)> {
    passwd
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() >= 4).then(|| (fields[0], fields[2].parse().ok(), fields[3].parse().ok()))
        })
        .collect()
}

/// A file owner: the salt master user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// Looks a user up in /etc/passwd (the salt user is a local system user).
    pub fn from_user(name: &str) -> io::Result<Owner> {
        let passwd = std::fs::read_to_string("/etc/passwd")?;
        passwd_entries(&passwd)
            .into_iter()
            .filter(|(user, _, _)| *user == name)
            .find_map(|(_, uid, gid)| Some(Owner { uid: uid?, gid: gid? }))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no user {name:?} in /etc/passwd")))
    }

    /// The owner of `path` itself (never of a symlink's target).
    pub fn of_path(path: &Path) -> io::Result<Owner> {
        let st = rustix::fs::lstat(path)?;
        Ok(Owner { uid: st.st_uid, gid: st.st_gid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_names_users_by_uid_and_uids_by_name() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nbroken\nsalt:x:999:998::/opt/saltstack/salt:/bin/sh\nodd:x:n:1::/:/bin/sh\n";
        let entries = passwd_entries(passwd);
        assert_eq!(entries, [("root", Some(0), Some(0)), ("salt", Some(999), Some(998)), ("odd", None, Some(1))]);
        // The machine's own /etc/passwd, both ways round.
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(Owner::from_user("root").unwrap(), Owner { uid: 0, gid: 0 });
        assert!(Owner::from_user("no-such-user-here").is_err());
    }
}
