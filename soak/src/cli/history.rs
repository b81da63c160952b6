//! `plateau history`: runs across nights in an SQLite database.

use std::path::{Path, PathBuf};

use clap::Subcommand;

use super::{HARNESS, INCONCLUSIVE, LEAK, PASS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: HistoryCmd,
}

pub fn main(a: Args) -> u8 {
    history(a.cmd)
}

#[derive(Subcommand)]
enum HistoryCmd {
    /// Store run directories (header, environment, verdict, per-metric level and slope); a run
    /// already stored is skipped, and so is a directory without samples (a run that ended before
    /// its first sample), with a line that says so. All or nothing for the rest: every directory
    /// is read before any is stored.
    Add {
        #[arg(required = true, value_name = "RUN_DIR")]
        run_dirs: Vec<PathBuf>,
        /// The history database, SQLite (created if missing).
        #[arg(long)]
        db: PathBuf,
    },
    /// Print the trend across nights (markdown tables) and write an HTML page of it.
    Show {
        /// The history database, SQLite.
        #[arg(long)]
        db: PathBuf,
        /// Only this scenario.
        #[arg(long)]
        scenario: Option<String>,
        /// Only this metric, night by night (default: every gauge, first and last night).
        #[arg(long)]
        metric: Option<String>,
        /// Only the last N nights of each scenario (0: all).
        #[arg(long, default_value_t = 0)]
        last: usize,
        /// Where to write the HTML page (default: beside the database, DB.html).
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// Judge each scenario's nights as a series from its baseline night (`pin`, else its first
    /// passing night): exit 1 when the latest night failed its own verdict, or a gauge's level
    /// jumped more than the tolerance above every night since the baseline, or creeps (a
    /// significant rise over 4 or more nights) to more than the tolerance above the baseline, or
    /// its slope passed the steepest of the last N passing nights by more than the run resolves;
    /// 4 when a scenario's latest night could not be judged (too short, unfinished, undecided) or
    /// no scenario has a night to compare.
    Check {
        /// The history database, SQLite.
        #[arg(long)]
        db: PathBuf,
        /// Only this scenario.
        #[arg(long)]
        scenario: Option<String>,
        /// Passing nights whose slopes the latest is compared with.
        #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..=365))]
        last: u64,
        /// Allowed rise of a gauge's level, in percent: above the highest night since the
        /// baseline (a jump), or above the baseline (a creep).
        #[arg(long, default_value_t = 10.0)]
        level_tolerance_pct: f64,
    },
    /// Make a stored run (a complete passing night) the baseline its scenario's later nights are
    /// measured from; it replaces the scenario's earlier pin.
    Pin {
        #[arg(value_name = "RUN_DIR")]
        run_dir: PathBuf,
        /// The history database, SQLite.
        #[arg(long)]
        db: PathBuf,
    },
}

/// `plateau history ...`: exit 0, 1 (a regression), 2 (bad input), 3 (cannot write), 4 (nothing
/// to compare).
fn history(cmd: HistoryCmd) -> u8 {
    use plateau_soak::history;
    match cmd {
        HistoryCmd::Add { run_dirs, db } => add(&run_dirs, &db),
        HistoryCmd::Show { db, scenario, metric, last, html } => {
            let f = history::show::ShowFilter { scenario, metric, last };
            let page = html.unwrap_or_else(|| db.with_extension("html"));
            let out = history::open(&db, false).and_then(|c| {
                let md = history::show::markdown(&c, &db, &f)?;
                let h = history::show::html(&c, &db, &f)?;
                Ok((md, h))
            });
            match out {
                Ok((md, h)) => {
                    plateau_shell::out!("{md}");
                    if let Err(e) = plateau_soak::fsutil::write_atomic(&page, h.as_bytes()) {
                        plateau_shell::errln!("plateau: history: --html {}: {e}", page.display());
                        return USAGE;
                    }
                    plateau_shell::errln!("history: page written to {}", page.display());
                    PASS
                }
                Err(e) => error_code(e),
            }
        }
        HistoryCmd::Pin { run_dir, db } => {
            let pinned = history::store::read_run(&run_dir)
                .and_then(|r| history::open(&db, false).and_then(|c| history::check::pin(&c, &db, &r)));
            match pinned {
                Ok(line) => {
                    plateau_shell::outln!("history: {line}");
                    PASS
                }
                Err(e) => error_code(e),
            }
        }
        HistoryCmd::Check { db, scenario, last, level_tolerance_pct } => {
            check(&db, scenario.as_deref(), last, level_tolerance_pct)
        }
    }
}

/// A history error said, and its exit code: bad input 2, a store that cannot be written 3.
fn error_code(e: plateau_soak::history::HistoryError) -> u8 {
    use plateau_soak::history::HistoryError;
    match e {
        HistoryError::Input(m) => {
            plateau_shell::errln!("plateau: history: {m}");
            USAGE
        }
        HistoryError::Harness(m) => {
            plateau_shell::errln!("plateau: history: {m}");
            HARNESS
        }
    }
}

/// `history add`: the runs of `run_dirs` into `db`; a directory with no samples is said and skipped.
fn add(run_dirs: &[PathBuf], db: &Path) -> u8 {
    use plateau_soak::history;
    // A directory a run left without samples (refused or failed before its first sample)
    // is no night: said and skipped, so that `history add runs/*` stores the rest.
    let (with, without): (Vec<&PathBuf>, Vec<&PathBuf>) =
        run_dirs.iter().partition(|d| history::store::has_samples(d) || !d.is_dir());
    for d in &without {
        plateau_shell::errln!(
            "plateau: history: {}: no samples.jsonl (a run that ended before its first sample): skipped",
            d.display()
        );
    }
    if with.is_empty() {
        plateau_shell::errln!("plateau: history: none of the directories holds a run's samples: nothing to add");
        return USAGE;
    }
    let runs = match with.iter().map(|d| history::store::read_run(d)).collect::<Result<Vec<_>, _>>() {
        Ok(r) => r,
        Err(e) => return error_code(e),
    };
    let added = history::open(db, true)
        .and_then(|mut c| history::store::add(&mut c, db, &runs, &plateau_soak::environment::utc_now()));
    match added {
        Ok(n) => {
            let kept = runs.len() - n.new - n.replaced;
            let replaced = match n.replaced {
                0 => String::new(),
                r => format!(", {r} stored before under another verdict replaced by the judgement of their samples"),
            };
            plateau_shell::outln!("history: {} runs added to {} ({kept} already there{replaced})", n.new, db.display());
            PASS
        }
        Err(e) => error_code(e),
    }
}

/// `history check`: each scenario's last night against its baseline; exit 1 on a regression, 4
/// when nothing (or not everything) could be judged.
fn check(db: &Path, scenario: Option<&str>, last: u64, level_tolerance_pct: f64) -> u8 {
    use plateau_soak::history;
    if !(level_tolerance_pct.is_finite() && level_tolerance_pct >= 0.0) {
        plateau_shell::errln!(
            "plateau: history: --level-tolerance-pct {level_tolerance_pct}: give a percentage of 0 or more"
        );
        return USAGE;
    }
    let o = history::check::CheckOptions { last: last as usize, level_tolerance_pct };
    match history::open(db, false).and_then(|c| history::check::check(&c, db, scenario, &o)) {
        Ok(out) => {
            for line in &out.compared {
                plateau_shell::outln!("{line}");
            }
            for line in &out.regressions {
                plateau_shell::outln!("REGRESSION {line}");
            }
            for line in &out.undecided {
                plateau_shell::outln!("UNDECIDED {line}");
            }
            if !out.regressions.is_empty() {
                LEAK
            } else if !out.undecided.is_empty() {
                plateau_shell::errln!(
                    "plateau: history: {} scenario(s) could not be judged tonight: nothing here is a pass",
                    out.undecided.len()
                );
                INCONCLUSIVE
            } else if out.groups_judged == 0 {
                plateau_shell::errln!(
                    "plateau: history: no scenario has a night to compare with its baseline: nothing judged"
                );
                INCONCLUSIVE
            } else {
                plateau_shell::outln!("history: no regression");
                PASS
            }
        }
        Err(e) => error_code(e),
    }
}
