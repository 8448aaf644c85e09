//! Telling an OOM kill from any other SIGKILL: the kernel's own counters decide (the job's
//! memory group's `oom_kill`, or, without one, the kernel's global count), and the
//! processes that died of a SIGKILL the supervisor did not send name the victim.

use crate::model::resources::Limits;
use crate::os::cgroup::JobCgroup;
use crate::os::resources::global_oom_kills;

/// How many victims a reason names.
const NAMED: usize = 3;

/// What the supervisor gathers while the job runs.
pub(super) struct Watch {
    /// The kernel's global OOM kill count at the start.
    global_start: Option<u64>,
    /// Processes of the job that died of a SIGKILL not sent by the supervisor (pid, comm).
    victims: Vec<(i32, String)>,
    /// Whether the supervisor itself has sent KILL (from then on a SIGKILL names nobody).
    pub(super) killing: bool,
}

/// What the end decides.
pub(super) struct Verdict {
    pub(super) reason: String,
}

impl Watch {
    pub(super) fn new() -> Watch {
        Watch {
            global_start: global_oom_kills(),
            victims: Vec::new(),
            killing: false,
        }
    }

    /// A process of the job died of SIGKILL (its `comm` read before it was reaped).
    pub(super) fn killed(&mut self, pid: i32, comm: Option<String>) {
        if !self.killing && self.victims.len() < 64 {
            self.victims.push((pid, comm.unwrap_or_default()));
        }
    }

    /// Whether the job had an OOM kill and what to say of it. With a memory group, its
    /// counter is the kernel's word (it counts every OOM kill of its processes, whoever's
    /// limit was reached); without one, the global counter must have moved and a process
    /// of the job must have died of a SIGKILL nobody we know sent (`requested_kill`: a
    /// signal request sent KILL, which explains such a death).
    pub(super) fn verdict(
        &self,
        cg: Option<&JobCgroup>,
        limits: Option<&Limits>,
        requested_kill: bool,
    ) -> Option<Verdict> {
        let limit = limits.and_then(|l| l.memory_bytes);
        let (oom, own) = match cg.and_then(JobCgroup::oom) {
            Some(c) => (c.kills > 0, c.hit_limit && limit.is_some()),
            None => {
                let moved = match (self.global_start, global_oom_kills()) {
                    (Some(a), Some(b)) => b > a,
                    _ => false,
                };
                (moved && !self.victims.is_empty() && !requested_kill, false)
            }
        };
        if !oom {
            return None;
        }
        // The kernel's log names the victims and the group whose limit was reached, where
        // it can be read (as root); else the SIGKILLed processes this supervisor reaped.
        let id = cg
            .and_then(|c| c.path().file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("job_");
        let pids: Vec<i32> = self.victims.iter().map(|v| v.0).collect();
        let logged = crate::os::resources::logged_oom_kills(id, &pids);
        if let Some(first) = logged.first() {
            let named: Vec<String> = logged
                .iter()
                .take(NAMED)
                .map(|k| format!("{} (pid {})", k.task, k.pid))
                .collect();
            let more = logged.len().saturating_sub(NAMED);
            let mut who = format!("process {}", named.join(", "));
            if more > 0 {
                who.push_str(&format!(" and {more} more"));
            }
            let marker = format!("/gitterm/{id}");
            let whose = match (&first.oom_memcg, limit) {
                (Some(m), Some(l)) if m.ends_with(&marker) => format!(
                    "the job reached its memory limit ({})",
                    Limits::show_bytes(l)
                ),
                (Some(m), _) if first.constraint == "CONSTRAINT_MEMCG" => {
                    format!("the sandbox reached its memory limit (cgroup {m}), not the job's own")
                }
                _ => "the machine ran out of memory (not the job's own limit)".to_string(),
            };
            return Some(Verdict {
                reason: format!("out of memory: the kernel's OOM killer ended {who}; {whose}"),
            });
        }
        let who = if self.victims.is_empty() {
            "a process of the job".to_string()
        } else {
            let named: Vec<String> = self
                .victims
                .iter()
                .take(NAMED)
                .map(|(pid, comm)| match comm.is_empty() {
                    true => format!("pid {pid}"),
                    false => format!("{comm} (pid {pid})"),
                })
                .collect();
            let more = self.victims.len().saturating_sub(NAMED);
            let mut s = format!("process {}", named.join(", "));
            if more > 0 {
                s.push_str(&format!(" and {more} more"));
            }
            s
        };
        let whose = match (own, limit) {
            (true, Some(l)) => format!(
                "the job reached its memory limit ({})",
                Limits::show_bytes(l)
            ),
            _ => "the sandbox ran out of memory (not the job's own limit)".to_string(),
        };
        Some(Verdict {
            reason: format!("out of memory: the kernel's OOM killer ended {who}; {whose}"),
        })
    }
}
