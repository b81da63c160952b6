//! A deployment (`--topology`): the processes of one served model, each under its role (a
//! prefill node, a decode node, the proxy that routes between them). Lifecycle:
//! [`start_deployment`] starts them in the topology's order, each once the one before answers its
//! health URL, with its own environment ([`env_for`]: `--spawn-env ROLE:KEY` entries for it, plain
//! ones for all); the run probes each under its role; dropping the [`Deployment`] stops them in the
//! reverse order, whatever ended the run.

use plateau_driver::RunError;

use super::{python, target, topology, tree, ExternalOptions};

/// The environment of one spawned process: `role`'s in a deployment (`ROLE:KEY` entries for it,
/// plain `KEY` ones for every process), or the one server's (`role` None: plain entries only).
pub(crate) fn env_for(env: &[(String, String)], role: Option<&str>) -> Vec<(String, String)> {
    env.iter()
        .filter_map(|(k, v)| match (k.split_once(':'), role) {
            (None, _) => Some((k.clone(), v.clone())),
            (Some((r, key)), Some(role)) if r == role => Some((key.to_string(), v.clone())),
            (Some(_), _) => None,
        })
        .collect()
}

/// A `ROLE:KEY` entry of `--spawn-env` whose role is not one of the deployment's (or any, with no
/// deployment): bad input, named.
pub(crate) fn check_role_env(env: &[(String, String)], topology: Option<&topology::Topology>) -> Result<(), RunError> {
    for (k, _) in env {
        let Some((role, _)) = k.split_once(':') else { continue };
        match topology {
            None => {
                return Err(RunError::Input(format!(
                    "--spawn-env {k}=...: ROLE:KEY is for one process of a --topology deployment"
                )))
            }
            Some(t) if !t.processes.iter().any(|p| p.role == role) => {
                let roles: Vec<&str> = t.processes.iter().map(|p| p.role.as_str()).collect();
                return Err(RunError::Input(format!(
                    "--spawn-env {k}=...: the deployment has no role {role:?} (its roles: {})",
                    roles.join(", ")
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// One process of a deployment (`--topology`): its role, the process, its tree.
pub(crate) struct RoleProcess {
    pub role: String,
    pub target: target::Target,
    pub tree: tree::Tree,
}

/// The processes of a deployment, stopped in the reverse of their start order when dropped
/// (the proxy before the nodes it routes to), whatever ended the run.
#[derive(Default)]
pub(crate) struct Deployment {
    pub procs: Vec<RoleProcess>,
}

impl Deployment {
    pub fn stop(&mut self) {
        while let Some(mut p) = self.procs.pop() {
            p.target.stop();
        }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts a topology's processes in order, each once the one before answers its health URL.
pub(crate) fn start_deployment(
    topo: &topology::Topology,
    ext: &ExternalOptions,
    out_dir: &std::path::Path,
    runtime: &tokio::runtime::Runtime,
    hook: Option<&python::Hook>,
) -> Result<Deployment, RunError> {
    let mut d = Deployment::default();
    for p in &topo.processes {
        let log = out_dir.join(format!("target-{}.log", p.role));
        let (cmd, env) = with_hook(hook, &p.spawn, env_for(&ext.spawn_env, Some(&p.role)));
        let mut t =
            target::Target::spawn(&cmd, &env, &log).map_err(|e| RunError::Input(format!("process {}: {e}", p.role)))?;
        let who = format!("{} process", p.role);
        runtime.block_on(super::wait_answering(
            &who,
            &p.health,
            std::slice::from_ref(&p.health),
            &mut t,
            ext.ready_timeout,
            &log,
        ))?;
        let tree = tree::Tree::for_role(t.pid, &p.role, hook);
        plateau_shell::errln!("plateau: {} started (pid {}): {}", p.role, t.pid, p.spawn);
        d.procs.push(RoleProcess { role: p.role.clone(), target: t, tree });
    }
    Ok(d)
}

/// A spawned process's command and environment with plateau's Python hook in them, where the run
/// has one.
pub(crate) fn with_hook(
    hook: Option<&python::Hook>,
    cmd: &str,
    env: Vec<(String, String)>,
) -> (String, Vec<(String, String)>) {
    match hook {
        Some(h) => (h.command(cmd), h.env(&env)),
        None => (cmd.to_string(), env),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_role_s_environment_is_its_own_entries_and_everyone_s() {
        let e = env(&[("A", "1"), ("decode:LD_PRELOAD", "/x.so:/y.so"), ("prefill:B", "2")]);
        assert_eq!(env_for(&e, Some("decode")), env(&[("A", "1"), ("LD_PRELOAD", "/x.so:/y.so")]));
        assert_eq!(env_for(&e, Some("proxy")), env(&[("A", "1")]));
        assert_eq!(env_for(&e, None), env(&[("A", "1")]));
    }

    #[test]
    fn a_role_s_environment_names_a_role_of_the_deployment() {
        let t = topology::Topology {
            url: "http://127.0.0.1:1".into(),
            processes: vec![topology::Process { role: "decode".into(), spawn: "x".into(), health: "tcp://x".into() }],
            ports: BTreeMap::new(),
            soak: None,
        };
        assert!(check_role_env(&env(&[("decode:A", "1"), ("B", "2")]), Some(&t)).is_ok());
        let e = check_role_env(&env(&[("prefil:A", "1")]), Some(&t)).unwrap_err().to_string();
        assert!(e.contains("no role \"prefil\" (its roles: decode)"), "{e}");
        let e = check_role_env(&env(&[("decode:A", "1")]), None).unwrap_err().to_string();
        assert!(e.contains("ROLE:KEY is for one process of a --topology deployment"), "{e}");
    }
}
