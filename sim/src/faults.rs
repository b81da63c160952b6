//! Fault plans: what goes wrong in a simulated run, and when, drawn from the run's seed.
//!
//! A plan is a list of episodes, each a start event and (for all but a client disconnect) an end
//! event that undoes it: kill then restart a node, pause then resume, clog a node or one direction
//! of a link then unclog, a window of packet loss or of long latencies, a window of slow KV
//! transfers from one node. Episodes on one node never overlap (a node is killed or paused, not
//! both), nor do two network-wide windows. After the workload ends the cluster heals: every
//! remaining end event runs, so that the run can drain and be checked.
//!
//! Node 0 is the router; engine nodes are 1..=n. The router is never killed or paused (it is the
//! client's front door: its death would end every request, which tells nothing), but its links
//! are clogged like any other.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    None,
    Light,
    Default,
    Heavy,
}

impl Profile {
    pub const ALL: [(&'static str, Profile, &'static str); 4] = [
        ("none", Profile::None, "no faults: the cluster, the workload and client aborts only"),
        ("light", Profile::Light, "two fault episodes per run: kills, pauses, clogs, loss, slow transfers"),
        ("default", Profile::Default, "six fault episodes per run, of every kind"),
        ("heavy", Profile::Heavy, "sixteen fault episodes per run, overlapping across nodes"),
    ];

    pub fn parse(name: &str) -> Result<Profile, String> {
        Profile::ALL.iter().find(|(n, ..)| *n == name).map(|(_, p, _)| *p).ok_or_else(|| {
            let known: Vec<&str> = Profile::ALL.iter().map(|(n, ..)| *n).collect();
            format!("unknown fault profile `{name}`; known: {}", known.join(", "))
        })
    }

    fn episodes(self) -> usize {
        match self {
            Profile::None => 0,
            Profile::Light => 2,
            Profile::Default => 6,
            Profile::Heavy => 16,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    Kill(usize),
    Restart(usize),
    Pause(usize),
    Resume(usize),
    ClogNode(usize),
    UnclogNode(usize),
    /// One direction: messages from the first node to the second are held back.
    ClogLink(usize, usize),
    UnclogLink(usize, usize),
    /// Packet loss in permille for every message (0 ends the window).
    PacketLoss(u32),
    /// Message latency range in ms (None restores madsim's default of 1..10 ms).
    Latency(Option<(u64, u64)>),
    /// KV transfers served by a node take this many times longer (1 ends the window).
    SlowTransfers(usize, u64),
    /// A client goes away: the router aborts everything it has in flight.
    Disconnect(u32),
}

impl Fault {
    /// Whether this event undoes an earlier one (the healing step runs all of these).
    pub fn is_end(&self) -> bool {
        matches!(
            self,
            Fault::Restart(_)
                | Fault::Resume(_)
                | Fault::UnclogNode(_)
                | Fault::UnclogLink(..)
                | Fault::PacketLoss(0)
                | Fault::Latency(None)
                | Fault::SlowTransfers(_, 1)
        )
    }

    /// The event that ends this one's episode (None for an end, and for a disconnect).
    pub fn undo(&self) -> Option<Fault> {
        if self.is_end() {
            return None;
        }
        Some(match *self {
            Fault::Kill(n) => Fault::Restart(n),
            Fault::Pause(n) => Fault::Resume(n),
            Fault::ClogNode(n) => Fault::UnclogNode(n),
            Fault::ClogLink(a, b) => Fault::UnclogLink(a, b),
            Fault::PacketLoss(_) => Fault::PacketLoss(0),
            Fault::Latency(_) => Fault::Latency(None),
            Fault::SlowTransfers(n, _) => Fault::SlowTransfers(n, 1),
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    pub at_ms: u64,
    pub fault: Fault,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FaultPlan {
    /// Sorted by time; ties keep the order of generation.
    pub events: Vec<Scheduled>,
}

/// Where and when faults may fall.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub engine_nodes: usize,
    pub clients: u32,
    pub horizon_ms: u64,
}

/// One episode as raw numbers: kind, node, other node, start, length, strength.
pub type Draw = [u64; 6];

impl FaultPlan {
    pub fn generate(profile: Profile, shape: Shape, seed: u64) -> FaultPlan {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xFA17_FA17_FA17_FA17);
        let draws: Vec<Draw> = (0..profile.episodes() * 20).map(|_| std::array::from_fn(|_| rng.next_u64())).collect();
        FaultPlan::from_draws(shape, &draws, profile.episodes())
    }

    /// Builds a plan from raw draws (a seeded RNG's, or a property test's), one episode per draw,
    /// at most `max_episodes`; a draw that would overlap an episode on the same node (or another
    /// network-wide window) is skipped.
    pub fn from_draws(shape: Shape, draws: &[Draw], max_episodes: usize) -> FaultPlan {
        let mut plan = FaultPlan::default();
        // Busy intervals per node (index 0: network-wide windows), so episodes never overlap there.
        let mut busy: Vec<Vec<(u64, u64)>> = vec![Vec::new(); shape.engine_nodes + 1];
        let mut episodes = 0;
        for &[kind, node, other, start, length, strength] in draws {
            if episodes == max_episodes {
                break;
            }
            let start = start % shape.horizon_ms.max(1);
            let end = start + 20 + length % (shape.horizon_ms / 4).max(1);
            let node = 1 + (node % shape.engine_nodes.max(1) as u64) as usize;
            let other = (other % (shape.engine_nodes as u64 + 1)) as usize;
            let (slot, begin) = match kind % 9 {
                0 | 1 => (node, Fault::Kill(node)),
                2 => (node, Fault::Pause(node)),
                3 => (node, Fault::ClogNode(node)),
                4 if other != node => (node, Fault::ClogLink(node, other)),
                5 => (0, Fault::PacketLoss(10 + (strength % 90) as u32)),
                6 => {
                    let min = 5 + strength % 20;
                    (0, Fault::Latency(Some((min, min + 10 + strength % 80))))
                }
                7 => (node, Fault::SlowTransfers(node, 10 + strength % 90)),
                8 if shape.clients > 0 => {
                    let c = (strength % u64::from(shape.clients)) as u32;
                    plan.events.push(Scheduled { at_ms: start, fault: Fault::Disconnect(c) });
                    episodes += 1;
                    continue;
                }
                _ => continue,
            };
            if busy[slot].iter().any(|&(a, b)| start < b + 5 && a < end + 5) {
                continue;
            }
            busy[slot].push((start, end));
            let finish = begin.undo().expect("every episode but a disconnect has an end");
            plan.events.push(Scheduled { at_ms: start, fault: begin });
            plan.events.push(Scheduled { at_ms: end, fault: finish });
            episodes += 1;
        }
        plan.events.sort_by_key(|s| s.at_ms);
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape { engine_nodes: 4, clients: 4, horizon_ms: 2_000 }
    }

    #[test]
    fn plans_are_seeded_sorted_and_balanced() {
        let a = FaultPlan::generate(Profile::Heavy, shape(), 7);
        assert_eq!(a, FaultPlan::generate(Profile::Heavy, shape(), 7));
        assert_ne!(a, FaultPlan::generate(Profile::Heavy, shape(), 8));
        assert!(a.events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        let starts = a.events.iter().filter(|s| !s.fault.is_end() && !matches!(s.fault, Fault::Disconnect(_))).count();
        let ends = a.events.iter().filter(|s| s.fault.is_end()).count();
        assert_eq!(starts, ends);
        assert!(a.events.iter().all(|s| !matches!(s.fault, Fault::Kill(0) | Fault::Pause(0))));
        assert!(FaultPlan::generate(Profile::None, shape(), 7).events.is_empty());
    }

    #[test]
    fn kills_and_pauses_of_one_node_never_overlap() {
        for seed in 0..200 {
            let plan = FaultPlan::generate(Profile::Heavy, shape(), seed);
            let mut down = [false; 5];
            for s in &plan.events {
                match s.fault {
                    Fault::Kill(n) | Fault::Pause(n) => {
                        assert!(!down[n], "seed {seed}: node {n} taken down twice");
                        down[n] = true;
                    }
                    Fault::Restart(n) | Fault::Resume(n) => down[n] = false,
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn unknown_profiles_name_the_known_ones() {
        assert!(Profile::parse("chaos").unwrap_err().contains("none, light, default, heavy"));
    }
}
