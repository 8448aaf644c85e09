//! The supervisor's loop: pump output, reap, enforce timeouts, end the whole tree.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::os::proc::{self};

use super::sink::{CHUNK, FIRST_READ, Sink};
use super::{End, Supervisor};

impl Supervisor {
    pub(super) fn run(&mut self) {
        let started = Instant::now();
        let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
        let deadline = started + secs(self.spec.timeout_seconds);
        let idle = self.spec.idle_timeout_seconds.map(secs);
        let grace = secs(self.spec.grace_seconds);
        let mut last_output = started;
        let mut shell_status: Option<WaitStatus> = None;
        let mut ending: Option<(End, Instant)> = None;
        let mut killed = false;
        let mut last_kill = started;
        // Small at first, so a job that prints little never touches a large buffer (an
        // allocator that zeroes what it hands out would make every page of it private).
        let mut buf = vec![0u8; FIRST_READ];

        loop {
            let now = Instant::now();
            // Decide what is due.
            if ending.is_none() {
                if now >= deadline {
                    ending = Some((End::Timeout, now));
                    self.signal_all(Signal::SIGTERM);
                } else if idle.is_some_and(|i| now >= last_output + i) {
                    ending = Some((End::Idle, now));
                    self.signal_all(Signal::SIGTERM);
                }
            }
            if let Some((_, since)) = ending {
                if !killed && now >= since + grace {
                    killed = true;
                    last_kill = now;
                    self.signal_all(Signal::SIGKILL);
                } else if killed && now >= last_kill + Duration::from_millis(200) {
                    // Whatever survived (forked meanwhile, re-parented late) gets KILL again.
                    last_kill = now;
                    self.signal_all(Signal::SIGKILL);
                }
                if shell_status.is_some() && !self.any_alive() {
                    break;
                }
            }
            let mut wake = match ending {
                None => {
                    let mut w = deadline;
                    if let Some(i) = idle {
                        w = w.min(last_output + i);
                    }
                    w
                }
                Some(_) if killed => now + Duration::from_millis(50),
                // While ending, re-check often: processes die without telling us when they
                // are not our children.
                Some((_, since)) => (since + grace).min(now + Duration::from_millis(50)),
            };
            if self.pipe.is_none() && ending.is_none() {
                wake = wake.min(now + Duration::from_millis(500));
            }
            if let Some(t) = self.pending.due() {
                wake = wake.min(t);
            }
            let timeout = crate::os::poll::poll_timeout(
                wake.saturating_duration_since(now)
                    .min(Duration::from_secs(60)),
            );

            let slept_from = Instant::now();
            let (pipe_ready, sig_ready, others_ready, control_events, err_ready) = {
                let mut fds = vec![PollFd::new(self.sigfd.as_fd(), PollFlags::POLLIN)];
                if let Some(p) = &self.pipe {
                    fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
                }
                let err = self.stderr.as_ref().and_then(|e| e.pipe.as_ref()).map(|p| {
                    fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
                    fds.len() - 1
                });
                let others = self.others.fd().map(|fd| {
                    fds.push(PollFd::new(fd, PollFlags::POLLIN));
                    fds.len() - 1
                });
                let first_control = fds.len();
                if let Some(c) = &self.control {
                    fds.extend(c.fds());
                }
                match poll(&mut fds, timeout) {
                    Ok(_) => {
                        let r = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
                        let control: Vec<PollFlags> = fds[first_control..]
                            .iter()
                            .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                            .collect();
                        (
                            self.pipe.is_some() && r(&fds[1]),
                            r(&fds[0]),
                            others.is_some_and(|i| r(&fds[i])),
                            control,
                            err.is_some_and(|i| r(&fds[i])),
                        )
                    }
                    Err(_) => (false, false, false, Vec::new(), false),
                }
            };
            // Another job published its secrets: learn them now, while it runs, whether or
            // not this job prints anything meanwhile.
            if others_ready {
                self.learn_others(true);
            }
            if let Some(c) = &mut self.control
                && control_events.iter().any(|e| !e.is_empty())
            {
                c.ready(&control_events);
            }
            // Woken far later than asked: this process was stopped (a job of the agent's
            // own user can SIGSTOP it). If the deadline passed meanwhile the job ran
            // unsupervised past it: it timed out, whatever it did since, even exit 0.
            let woke = Instant::now();
            if ending.is_none()
                && woke >= deadline
                && woke > wake.max(slept_from) + Duration::from_secs(1)
            {
                ending = Some((End::Timeout, woke));
                self.signal_all(Signal::SIGTERM);
            }
            if pipe_ready {
                match self.read_pipe(&mut buf) {
                    Some(0) => self.pipe = None,
                    Some(_) => last_output = Instant::now(),
                    None => {}
                }
            }
            if err_ready {
                match self.read_err_pipe() {
                    Some(0) => {
                        if let Some(e) = &mut self.stderr {
                            e.pipe = None;
                        }
                    }
                    Some(_) => last_output = Instant::now(),
                    None => {}
                }
            }
            self.pending.update(&self.pipeline);
            if sig_ready {
                while let Ok(Some(info)) = self.sigfd.read_signal() {
                    let sig = info.ssi_signo as i32;
                    if sig == libc::SIGCHLD {
                        self.reap(&mut shell_status);
                    } else if ending.is_none() || matches!(ending, Some((End::ShellExited, _))) {
                        let kind = if sig == libc::SIGUSR1 {
                            End::Cancel
                        } else {
                            End::Stopped(sig)
                        };
                        // A cancel after the shell exited still wins over "exited": the
                        // caller asked and the job had not ended yet.
                        let since = ending.map(|e| e.1).unwrap_or_else(Instant::now);
                        ending = Some((kind, since));
                        self.signal_all(Signal::SIGTERM);
                    }
                }
            }
            if shell_status.is_some() && ending.is_none() {
                ending = Some((End::ShellExited, Instant::now()));
                // Most shells leave nothing behind: then there is nothing to signal or
                // wait for, and the job ends now.
                if !self.any_alive() {
                    break;
                }
                self.signal_all(Signal::SIGTERM);
            }
        }
        // Everything is dead: whatever is still in the pipe has no writer left.
        while self.pipe.is_some() {
            if !matches!(self.read_pipe(&mut buf), Some(n) if n > 0) {
                break;
            }
        }
        while self.stderr.as_ref().is_some_and(|e| e.pipe.is_some()) {
            if !matches!(self.read_err_pipe(), Some(n) if n > 0) {
                break;
            }
        }
        if let Some(e) = &mut self.stderr {
            self.rec.stderr_bytes = Some(e.finish());
        }
        if let Some(c) = &mut self.control
            && c.tty
        {
            c.output(&[], true);
        }
        // The last line goes to output.log: it is pending no more.
        self.pending.remove();
        let mut tail = self.sink.buffer();
        self.pipeline.finish(&mut tail);
        self.sink.store(tail);
        self.sink = std::mem::replace(&mut self.sink, Sink::Moved).joined();
        // Every process of the job is gone: nobody can read its environment any more.
        self.published = None;
        self.finish(
            shell_status,
            ending.map(|e| e.0).unwrap_or(End::ShellExited),
        );
        // Viewers learn how it ended; nobody can reach the job any more.
        if let Some(c) = self.control.take() {
            c.end(&self.rec);
        }
    }

    /// Reads once from the pipe; `Some(0)` at EOF, `None` when nothing was there.
    fn read_pipe(&mut self, buf: &mut Vec<u8>) -> Option<usize> {
        let pipe = self.pipe.as_ref()?;
        let n = match nix::unistd::read(pipe, buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => return None,
            Err(_) => return Some(0),
        };
        let n = n as usize;
        if n > 0 {
            // A full read means more is waiting: read more at a time, up to CHUNK. A full
            // read of CHUNK means a flood: from then on the writing overlaps with reading
            // and sanitizing on a thread of its own. A job that prints little never pays
            // for the thread.
            if n == CHUNK && self.sink.is_inline() {
                self.sink = std::mem::replace(&mut self.sink, Sink::Moved).threaded();
            }
            // After the read, before a byte of it goes anywhere (see livesecrets).
            self.learn_others(false);
            if let Some(c) = &mut self.control
                && c.tty
            {
                c.output(&buf[..n], false);
            }
            let mut chunk = self.sink.buffer();
            self.pipeline.feed(&buf[..n], &mut chunk);
            self.sink.store(chunk);
            self.pending.touched();
            if n == buf.len() && n < CHUNK {
                buf.resize((n * 4).min(CHUNK), 0);
            }
        }
        Some(n)
    }

    /// Reads once from the stderr pipe (a job with `separateStderr`): the bytes go to
    /// output.log as any output does, and to stderr.log through their own pipeline.
    fn read_err_pipe(&mut self) -> Option<usize> {
        let mut buf = [0u8; 64 * 1024];
        let pipe = self.stderr.as_ref()?.pipe.as_ref()?;
        let n = match nix::unistd::read(pipe, &mut buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => return None,
            Err(_) => return Some(0),
        };
        if n > 0 {
            self.learn_others(false);
            let mut chunk = self.sink.buffer();
            self.pipeline.feed(&buf[..n], &mut chunk);
            self.sink.store(chunk);
            self.pending.touched();
            if let Some(e) = &mut self.stderr {
                e.feed(&buf[..n]);
            }
        }
        Some(n)
    }

    /// Learns the secrets of jobs that started since the last look (one `stat` when none
    /// did; `woken`: the folder's watch fired). Before output (`woken` false) it adds all
    /// it learnt to the masking, stored and on the terminal wire; on a wake it only reads
    /// them (while their job still runs): the index is rebuilt once, before the next
    /// output, not for every job that starts meanwhile.
    fn learn_others(&mut self, woken: bool) {
        if woken {
            let new = self.others.woken();
            self.others_pending.extend(new);
            return;
        }
        let new = self.others.poll();
        self.others_pending.extend(new);
        if self.others_pending.is_empty() {
            return;
        }
        let learnt = std::mem::take(&mut self.others_pending);
        let values: Vec<&[u8]> = learnt.iter().map(|v| v.as_bytes()).collect();
        self.pipeline.add_secrets(&values);
        if let Some(c) = &mut self.control {
            c.add_secrets(&values);
        }
        if let Some(e) = &mut self.stderr {
            e.add_secrets(&values);
        }
    }

    fn reap(&mut self, shell_status: &mut Option<WaitStatus>) {
        loop {
            // A look before the reap: a process killed by SIGKILL is named (its comm is
            // readable until it is reaped), in case the kernel's OOM killer sent it.
            let peek = nix::sys::wait::waitid(
                nix::sys::wait::Id::All,
                WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
            );
            let pid = match peek {
                Ok(WaitStatus::Signaled(pid, Signal::SIGKILL, _)) => {
                    self.oom.killed(pid.as_raw(), proc::comm(pid.as_raw()));
                    pid
                }
                // No child at all, not even a zombie: nothing of the job can be our
                // descendant any more (orphans are re-parented only to an ancestor), so
                // the walk of /proc is over for good.
                Err(nix::errno::Errno::ECHILD) => {
                    self.childless = true;
                    break;
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(st) => st.pid().unwrap_or(Pid::from_raw(-1)),
            };
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(st) => {
                    if st.pid() == Some(Pid::from_raw(self.shell))
                        && matches!(st, WaitStatus::Exited(..) | WaitStatus::Signaled(..))
                    {
                        *shell_status = Some(st);
                    }
                }
            }
        }
    }

    /// True while any process of the job is alive (zombies do not count, but a zombie
    /// leader whose threads run on does).
    fn any_alive(&self) -> bool {
        (!self.childless && proc::descendants(self.me).iter().any(proc::alive))
            || self.cgroup.as_ref().is_some_and(|c| {
                c.pids()
                    .iter()
                    .any(|&p| proc::stat(p).is_some_and(|s| proc::alive(&s)))
            })
    }

    /// Signals every process of the job: our descendants (we are their subreaper, so this
    /// includes setsid and double-fork escapees) and whatever sits in the job's cgroup.
    fn signal_all(&mut self, sig: Signal) {
        if sig == Signal::SIGKILL {
            self.oom.killing = true;
        }
        for round in 0..3 {
            let procs: Vec<proc::Stat> = proc::descendants(self.me)
                .into_iter()
                .filter(proc::alive)
                .collect();
            for p in &procs {
                crate::os::pidfd::signal_verified(p.pid, p.start, sig);
                if sig == Signal::SIGTERM {
                    // A stopped process cannot act on TERM until continued.
                    crate::os::pidfd::signal_verified(p.pid, p.start, Signal::SIGCONT);
                }
            }
            if let Some(cg) = &self.cgroup {
                if sig == Signal::SIGKILL {
                    cg.kill_all();
                } else {
                    for pid in cg.pids() {
                        // Each process gets one TERM: those signalled as descendants above
                        // are not signalled again (a second TERM makes some programs skip
                        // their shutdown).
                        if procs.iter().any(|p| p.pid == pid) {
                            continue;
                        }
                        // Pin the process first, then check it still is in the job's
                        // cgroup: a pid read from cgroup.procs may have been reused.
                        let Some(st) = proc::stat(pid) else { continue };
                        let Some(fd) = crate::os::pidfd::Pidfd::open(pid, st.start) else {
                            continue;
                        };
                        if cg.holds(pid) {
                            fd.signal(sig);
                            fd.signal(Signal::SIGCONT);
                        }
                    }
                }
            }
            // KILL is repeated so a process forked while we were signalling is caught too.
            if sig != Signal::SIGKILL || procs.is_empty() || round == 2 {
                break;
            }
        }
    }
}
