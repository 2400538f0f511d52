use super::*;

#[test]
fn partitions_cover_everything_once() {
    for total in [1u64, 7, 262_144, 1_000_003] {
        for n in 1..=5usize {
            let mut next = 0;
            for i in 0..n {
                let (first, len) = partition(total, n, i);
                assert_eq!(first, next);
                next = first + len;
            }
            assert_eq!(next, total);
        }
    }
}

#[test]
fn stats_diff_subtracts() {
    let a = QueueStats {
        submitted: 10,
        completed: 9,
        sq_doorbell_writes: 5,
        polls: 100,
        ..Default::default()
    };
    let b = QueueStats {
        submitted: 4,
        completed: 4,
        sq_doorbell_writes: 2,
        polls: 1,
        ..Default::default()
    };
    let d = stats_diff(&a, &b);
    assert_eq!(
        (d.submitted, d.completed, d.sq_doorbell_writes, d.polls),
        (6, 5, 3, 99)
    );
}
