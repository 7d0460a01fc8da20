//! Child processes ([`Proc`]: output to a log file, killed and reaped on
//! drop, the log printed when a test panics), and what /proc says about a
//! process.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::temp::TempDir;
use super::wait::{poll, wait_for};

/// A child process whose stdout and stderr go to a log file; killed and
/// reaped on drop.
pub struct Proc {
    pub name: &'static str,
    child: Child,
    pub log: PathBuf,
    _dir: TempDir,
}

impl Proc {
    pub fn spawn(name: &'static str, mut cmd: Command, dir: TempDir) -> Proc {
        let log = dir.path().join(format!("{name}.log"));
        let out = File::create(&log).unwrap();
        cmd.stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Proc {
            name,
            child,
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child, which we have not reaped.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = &mut self.child;
        poll(timeout, Duration::from_millis(5), || child.try_wait().unwrap())
    }

    /// Waits up to `timeout` for the process to exit and returns its exit
    /// code (-1: killed by a signal); panics with its output when it does
    /// not exit.
    pub fn exit_code(&mut self, timeout: Duration) -> i32 {
        let status = self
            .wait_exit(timeout)
            .unwrap_or_else(|| panic!("{} did not exit within {timeout:?}:\n{}", self.name, self.output()));
        status.code().unwrap_or(-1)
    }

    /// Waits up to `timeout` for the process to exit, asserts its exit code
    /// is `code` (the output in the failure's message), and returns its
    /// output.
    #[track_caller]
    pub fn assert_exit(&mut self, timeout: Duration, code: i32) -> String {
        assert_eq!(self.exit_code(timeout), code, "{}", self.output());
        self.output()
    }

    /// Waits up to `timeout` until the output contains `text`; returns the
    /// output.
    pub fn wait_output(&self, text: &str, timeout: Duration) -> String {
        wait_for(&format!("{text:?} in the output of {}", self.name), timeout, || {
            let out = self.output();
            if out.contains(text) {
                Ok(out)
            } else {
                Err(out)
            }
        })
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("----- {} output -----\n{}", self.name, self.output());
        }
    }
}

// ---------------------------------------------------------------------------
// What /proc says about a process

/// A process's state letter (`R`, `S`, `Z`...), None once it is gone.
pub fn process_state(pid: i32) -> Option<char> {
    Some(procfs::process::Process::new(pid).ok()?.stat().ok()?.state)
}

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: i32) -> bool {
    process_state(pid).is_some_and(|state| state != 'Z')
}

/// The children of `pid`, from every thread's `children` list.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = procfs::process::Process::new(pid).and_then(|p| p.tasks()) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .flat_map(|task| task.children().unwrap_or_default())
        .map(|child| child as i32)
        .collect()
}

/// A process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in
/// KiB; zeros once it is gone.
pub fn memory_kib(pid: i32) -> (u64, u64) {
    match procfs::process::Process::new(pid).and_then(|p| p.status()) {
        Ok(status) => (status.vmrss.unwrap_or(0), status.vmhwm.unwrap_or(0)),
        Err(_) => (0, 0),
    }
}
