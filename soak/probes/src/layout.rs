//! The same address space in every run of a seed.
//!
//! The kernel places a process's mappings at a random offset (address-space layout
//! randomisation), and jemalloc's bookkeeping depends on where its mappings land: its radix tree of
//! extents takes a leaf (512 KiB on a 57-bit build, 2 MiB on a 48-bit one) for every region of
//! address space (128 MiB or 1 GiB) that its extents reach. So two runs of one seed that allocate
//! the same bytes differed in `jemalloc.metadata` by one or two leaves, taken at iterations that
//! moved from run to run: in 17 runs of `mixed` with the bounded-cache plant the extra leaf came
//! at iterations 1, 2, 11, 55 and 104, and one run in CI judged the step a leak. With the
//! randomisation off, three runs agreed to the byte, and moving the address space's base (through
//! the stack limit) moved the step alone.
//!
//! Lifecycle: [`fix`] runs first thing in the `plateau` binary. If the kernel randomises this
//! process's layout it turns that off for the process (`personality(ADDR_NO_RANDOMIZE)`, what gdb
//! does before it starts a program under debug) and executes the program again, since a layout is
//! made at exec; the new image finds the flag set and goes on. Processes it starts inherit the
//! flag: its own (`plateau node`, `plateau run` under selftest) keep it, and a server it soaks
//! (`--spawn`) gets the kernel's usual layout back ([`restore_in_child`]), so that plateau changes
//! nothing about how the target runs. `PLATEAU_ASLR=keep` keeps the randomisation (a run is then
//! reproducible from its seed up to the allocator's layout), and a kernel that refuses the
//! personality leaves it on; environment.json says which ([`Layout::describe`]).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

/// The environment variable a user sets to `keep` to run with the kernel's randomisation.
pub const KEEP_ENV: &str = "PLATEAU_ASLR";

/// Set by plateau in the image it executes again: the flag is plateau's, to be taken back for a
/// server it spawns. Never read from a user.
const SET_BY_PLATEAU_ENV: &str = "PLATEAU_LAYOUT_FIXED_BY_PLATEAU";

/// What [`fix`] found, for [`describe_current`].
static FOUND: std::sync::OnceLock<Layout> = std::sync::OnceLock::new();

/// The personality flag (linux/personality.h), as personality(2) takes it.
const ADDR_NO_RANDOMIZE: libc::c_ulong = libc::ADDR_NO_RANDOMIZE as libc::c_ulong;

/// How this process's address space was laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Randomisation off, turned off by plateau.
    FixedByPlateau,
    /// Randomisation was already off when plateau started (`setarch -R`, a debugger).
    AlreadyFixed,
    /// Kept on, as `PLATEAU_ASLR=keep` asked.
    Kept,
    /// Still on: the kernel refused the personality, or the program could not be executed again.
    Randomised(String),
}

impl Layout {
    /// One line for environment.json and the report.
    pub fn describe(&self) -> String {
        match self {
            Layout::FixedByPlateau => "fixed: address-space randomisation turned off by plateau".into(),
            Layout::AlreadyFixed => "fixed: address-space randomisation was off when plateau started".into(),
            Layout::Kept => format!("randomised: {KEEP_ENV}=keep"),
            Layout::Randomised(why) => format!("randomised: {why}"),
        }
    }
}

/// The personality of this process, or None if the kernel does not say.
fn persona() -> Option<libc::c_ulong> {
    // SAFETY: personality(0xffffffff) only reads the current persona.
    let p = unsafe { libc::personality(0xffff_ffff) };
    (p != -1).then_some(p as libc::c_ulong)
}

/// Turns the kernel's randomisation off for this process and executes the program again, or says
/// why the layout stays as it is (see the module's lifecycle). Returns only when no new image
/// was executed (or in that new image, where the flag is already set). An error names a value of
/// `PLATEAU_ASLR` other than `keep` (bad input: the caller exits 2).
pub fn fix() -> Result<Layout, String> {
    if let Some(v) = std::env::var_os(KEEP_ENV).filter(|v| v != "keep") {
        return Err(format!("{KEEP_ENV}={}: the one value it takes is `keep`", v.to_string_lossy()));
    }
    let found = decide();
    let _ = FOUND.set(found.clone());
    Ok(found)
}

/// This process's layout as [`fix`] left it, in [`Layout::describe`]'s words; where `fix` never
/// ran (a test binary, a library's user), what the persona says now.
pub fn describe_current() -> String {
    if let Some(l) = FOUND.get() {
        return l.describe();
    }
    match persona() {
        Some(p) if p & ADDR_NO_RANDOMIZE != 0 => Layout::AlreadyFixed.describe(),
        Some(_) => Layout::Randomised("plateau's binary did not start this process".into()).describe(),
        None => Layout::Randomised("the kernel does not report the personality".into()).describe(),
    }
}

fn decide() -> Layout {
    let Some(p) = persona() else { return Layout::Randomised("the kernel does not report the personality".into()) };
    if p & ADDR_NO_RANDOMIZE != 0 {
        return if std::env::var_os(SET_BY_PLATEAU_ENV).is_some() {
            Layout::FixedByPlateau
        } else {
            Layout::AlreadyFixed
        };
    }
    if std::env::var_os(KEEP_ENV).is_some() {
        return Layout::Kept;
    }
    // SAFETY: sets this process's persona; nothing else depends on it before the exec below.
    if unsafe { libc::personality(p | ADDR_NO_RANDOMIZE) } == -1 {
        return Layout::Randomised(format!("the kernel refused the personality ({})", std::io::Error::last_os_error()));
    }
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| OsString::from("plateau"));
    let err = std::process::Command::new("/proc/self/exe").arg0(argv0).args(args).env(SET_BY_PLATEAU_ENV, "1").exec();
    // Still here: the exec failed. Put the persona back so that what this process starts is
    // laid out as the kernel would.
    // SAFETY: as above.
    unsafe { libc::personality(p) };
    Layout::Randomised(format!("executing /proc/self/exe again failed ({err})"))
}

/// The persona a server plateau spawns should run with: the kernel's randomisation back where
/// plateau took it away, otherwise this process's own. Computed before the fork.
pub fn child_persona() -> Option<libc::c_ulong> {
    let p = persona()?;
    let plateaus = std::env::var_os(SET_BY_PLATEAU_ENV).is_some();
    (plateaus && p & ADDR_NO_RANDOMIZE != 0).then_some(p & !ADDR_NO_RANDOMIZE)
}

/// For a `pre_exec` hook of a server plateau spawns: sets `persona` from [`child_persona`]
/// (async-signal-safe: one system call).
pub fn restore_in_child(persona: Option<libc::c_ulong>) {
    if let Some(p) = persona {
        // SAFETY: personality is a plain system call, safe between fork and exec.
        unsafe { libc::personality(p) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_gets_the_randomisation_back_only_where_plateau_took_it() {
        // The test binary was not executed again by plateau: nothing to give back.
        if std::env::var_os(SET_BY_PLATEAU_ENV).is_none() {
            assert_eq!(child_persona(), None);
        }
        let lines = [Layout::FixedByPlateau, Layout::AlreadyFixed, Layout::Kept, Layout::Randomised("x".into())]
            .map(|l| l.describe());
        assert!(lines[0].starts_with("fixed") && lines[1].starts_with("fixed"));
        assert!(lines[2].contains("PLATEAU_ASLR=keep") && lines[3].starts_with("randomised"));
    }
}
