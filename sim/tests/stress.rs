//! The stress driver: writers publish, abort and free while readers check
//! every lookup against a shadow model, in v1 under W^X and in v2.

use std::time::Duration;

use jitmap::MapVersion;

#[test]
fn writers_against_readers_give_no_wrong_answer() {
    for (version, wx) in [(MapVersion::V1, true), (MapVersion::V2, false)] {
        let report = jitmap_sim::stress::run(jitmap_sim::stress::StressConfig {
            version,
            wx,
            writers: 1,
            readers: 2,
            duration: Duration::from_millis(1500),
            seed: 42,
        })
        .unwrap();
        assert_eq!(report.wrong, 0, "{version}: {report:?}");
        assert!(
            report.exact > 1000 && report.frees > 100 && report.aborts > 10,
            "{report:?}"
        );
        assert_eq!(
            report.publishes, report.frees,
            "every block is freed at the end"
        );
    }
}
