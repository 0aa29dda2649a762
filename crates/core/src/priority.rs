//! Background durability yields the CPU to foreground work. A checkpoint
//! is an agent's insurance, not what anyone on the machine waits to see:
//! it runs at a lower CPU priority (a higher nice value), so that on a
//! machine whose cores are all busy a reader (an editor, a build, another
//! agent's `cat`) waits less behind it. On an idle machine nice changes
//! nothing. Linux keeps a nice value per thread, and a thread starts with
//! its creator's.

/// The nice value added to a checkpoint's threads: `MADO_CHECKPOINT_NICE`
/// (0 to 19; 0 keeps the caller's priority), else 10.
pub fn checkpoint_nice() -> i32 {
    parse_nice(std::env::var("MADO_CHECKPOINT_NICE").ok().as_deref())
}

fn parse_nice(v: Option<&str>) -> i32 {
    v.and_then(|s| s.trim().parse::<i32>().ok()).map_or(10, |n| n.clamp(0, 19))
}

/// Adds `by` to the nice value of the calling thread (lowering its CPU
/// priority; raising it back needs privilege, so only threads that end
/// with the work are lowered). Best effort: a failure changes nothing.
pub fn lower_this_thread(by: i32) {
    lower(this_tid(), by);
}

/// Adds `by` to the nice value of every thread this process has now (a
/// command that does background work only, such as `ws checkpoint` of a
/// plain folder); the threads they start inherit it.
pub fn lower_this_process(by: i32) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return };
    for t in tasks.flatten() {
        if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
            lower(tid, by);
        }
    }
}

fn this_tid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

fn lower(tid: i32, by: i32) {
    if by <= 0 {
        return;
    }
    if let Some(now) = nice_of(tid) {
        // SAFETY: setpriority takes plain integers.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, (now + by).min(19)) };
    }
}

/// Thread `tid`'s nice value; `None` when it cannot be read.
fn nice_of(tid: i32) -> Option<i32> {
    // SAFETY: getpriority takes plain integers; -1 is a valid priority,
    // so errno tells a failure apart.
    unsafe {
        *libc::__errno_location() = 0;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        (now != -1 || *libc::__errno_location() == 0).then_some(now)
    }
}

/// The calling thread's nice value.
pub fn this_thread_nice() -> Option<i32> {
    nice_of(this_tid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nice_value_is_read_from_the_variable_within_bounds() {
        assert_eq!(parse_nice(None), 10);
        assert_eq!(parse_nice(Some("0")), 0);
        assert_eq!(parse_nice(Some(" 5 ")), 5);
        assert_eq!(parse_nice(Some("40")), 19);
        assert_eq!(parse_nice(Some("-5")), 0);
        assert_eq!(parse_nice(Some("high")), 10);
    }

    /// Lowered on a thread of its own: the thread that asked keeps its
    /// priority, and the lowered one starts its own threads lowered.
    #[test]
    fn a_lowered_thread_is_lower_and_its_caller_is_not() {
        let before = this_thread_nice().unwrap();
        let (mine, child) = std::thread::spawn(move || {
            lower_this_thread(3);
            let child = std::thread::spawn(this_thread_nice).join().unwrap();
            (this_thread_nice(), child)
        })
        .join()
        .unwrap();
        assert_eq!(mine, Some((before + 3).min(19)));
        assert_eq!(child, mine, "a thread starts with its creator's nice value");
        assert_eq!(this_thread_nice(), Some(before));
        lower_this_thread(0);
        assert_eq!(this_thread_nice(), Some(before), "0 changes nothing");
    }
}
