//! Text for people outside this machine: no path of it (its home, its temporary folders, where
//! plateau or the server was installed), only what names a file to anyone: its last parts.

use std::sync::OnceLock;

/// Folders that name nothing but this machine: a path under them keeps its last part alone.
const PRIVATE: [&str; 5] = ["/tmp/", "/var/tmp/", "/home/", "/root/", "/run/user/"];

/// `text` with every absolute path of three or more parts cut to `…/PARENT/NAME`, and one under a
/// private folder (home, temporary) to `…/NAME`. URLs and endpoints (`/v1/models`) stay.
pub fn paths(text: &str) -> String {
    static PATH: OnceLock<regex::Regex> = OnceLock::new();
    let re = PATH.get_or_init(|| {
        regex::Regex::new(r#"(^|[\s"'=(\[`])(/[A-Za-z0-9._+\-@~%/]+)"#)
            .unwrap_or_else(|e| panic!("the path pattern: {e}"))
    });
    let home = std::env::var("HOME").ok().filter(|h| h.len() > 1).map(|h| format!("{}/", h.trim_end_matches('/')));
    let tmp = std::env::var("TMPDIR").ok().filter(|t| t.len() > 1).map(|t| format!("{}/", t.trim_end_matches('/')));
    re.replace_all(text, |c: &regex::Captures| {
        let (lead, path) = (&c[1], &c[2]);
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let private =
            PRIVATE.iter().map(|p| p.to_string()).chain(home.clone()).chain(tmp.clone()).any(|p| path.starts_with(&p));
        let cut = match (private, parts.len()) {
            (true, n) if n >= 1 => format!("…/{}", parts[n - 1]),
            (false, n) if n >= 3 => format!("…/{}/{}", parts[n - 2], parts[n - 1]),
            _ => path.to_string(),
        };
        format!("{lead}{cut}")
    })
    .into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths_of_this_machine_are_cut_and_urls_and_endpoints_stay() {
        let t = super::paths(
            "python3 /tmp/tmp.Ab12/venv-1.3.0/bin/python -m stubsrv --port 8 (/root/.pyenv/versions/3.11.7/bin/python3.11) at http://127.0.0.1:41051/v1/models; GET /v1/models; /work/shared/acceptance/sites_server.py",
        );
        assert!(!t.contains("/tmp/") && !t.contains("tmp.Ab12") && !t.contains("/root/"), "{t}");
        assert!(t.contains("python3 …/python -m stubsrv"), "{t}");
        assert!(t.contains("(…/python3.11)"), "{t}");
        assert!(t.contains("http://127.0.0.1:41051/v1/models") && t.contains("GET /v1/models"), "{t}");
        assert!(t.contains("…/acceptance/sites_server.py"), "{t}");
    }
}
