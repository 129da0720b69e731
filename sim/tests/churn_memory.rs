//! The agent's memory while versions churn beside a steady stream of frames
//! the signal handler cannot name (a version-1 method deeper than its
//! scan), which the collector names later. Its own test binary: it reads the
//! process's allocator, which other tests' frees would move.

use jitmap_sim::churn::churn;

/// 60,000 versions with the big method called after each: the allocator's
/// bytes do not grow after the first third. On the old collector nothing
/// was forgotten while a sample waited, and these always waited: it grew
/// 16.6 MiB after the first third, about 415 bytes a version.
#[test]
fn versions_are_forgotten_beside_a_stream_of_frames_the_handler_cannot_name() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    let c = churn(60_000, 3, 1000, 16_384, true).unwrap();
    let grew = c.points[3].malloc as f64 - c.points[1].malloc as f64;
    assert!(
        grew < 2.0 * 1048576.0,
        "grew {:.1} MiB after the first third: {c:?}",
        grew / 1048576.0
    );
    // Samples were taken, and named: the big method's deep frames among them.
    assert!(c.samples.0 >= 100, "{c:?}");
}
