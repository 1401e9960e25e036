//! The label grammar, resolution and its refusals, the reservation rule and `exceeds_host`, on
//! policies parsed from configuration text (so the shapes are what validation makes of a file).

use std::path::PathBuf;

use super::labels::{Ask, read};
use super::*;
use crate::config::bounds::HostFacts;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A host of 8 CPUs, 32 GiB and 200 GiB, two GPUs and one FPGA, `max_runners = 4`.
const HOST: &str = r#"
[host]
max_runners = 4
capacity = { cpu = 8, memory = "32G", disk = "200G" }
[[host.device]]
group = "gpu"
nodes = ["/dev/nvidia0"]
shared_nodes = ["/dev/nvidiactl"]
[[host.device]]
group = "gpu"
nodes = ["/dev/nvidia1"]
shared_nodes = ["/dev/nvidiactl"]
[[host.device]]
group = "fpga"
nodes = ["/dev/fpga0"]
"#;

/// A policy whose keys besides name, target and labels are `extra`, on [`HOST`].
fn policy(extra: &str) -> Policy {
    let text = format!(
        "{HOST}\n[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"linux\"]\n{extra}\n"
    );
    crate::config::from_text_on(&text, HostFacts::default())
        .unwrap()
        .policies
        .remove(0)
}

/// The shaped policy most tests use: a default of 2 CPUs, a shape_max, two named shapes.
fn shaped() -> Policy {
    policy(
        r#"cpu = 2
shape_max = { cpu = 8, memory = "32G", disk = "100G", gpu = 2 }
[[policy.shape]]
name = "large"
cpu = 6
memory = "16G"
disk = "50G"
gpu = 1
[[policy.shape]]
name = "small"
cpu = 1
[[policy.shape]]
name = "roomy"
memory = "24G"
"#,
    )
}

/// A job's labels, and the cpu, memory, disk and devices its shape resolves to.
type Resolved = (
    &'static [&'static str],
    Option<u64>,
    Option<u64>,
    Option<u64>,
    BTreeMap<String, u32>,
);

fn labels(labels: &[&str]) -> Vec<String> {
    labels.iter().map(|l| (*l).to_owned()).collect()
}

#[test]
fn every_kind_of_shape_label_is_read_in_any_case() {
    let cases: [(&str, &str, Ask); 12] = [
        ("rm-cpu=4", "cpu", Ask::Cpu(4000)),
        ("RM-CPU=0.5", "cpu", Ask::Cpu(500)),
        ("rm-cpu=1.125", "cpu", Ask::Cpu(1125)),
        ("rm-mem=32g", "mem", Ask::Memory(32 * GIB)),
        ("Rm-Mem=512M", "mem", Ask::Memory(512 * MIB)),
        ("rm-mem=64k", "mem", Ask::Memory(64 << 10)),
        ("rm-disk=1T", "disk", Ask::Disk(1 << 40)),
        ("rm-shape=large", "shape", Ask::Shape("large".to_owned())),
        ("rm-shape=LARGE", "shape", Ask::Shape("large".to_owned())),
        ("rm-gpu=2", "gpu", Ask::Devices("gpu".to_owned(), 2)),
        ("RM-GPU=1", "gpu", Ask::Devices("gpu".to_owned(), 1)),
        (
            "rm-fpga_x=3",
            "fpga_x",
            Ask::Devices("fpga_x".to_owned(), 3),
        ),
    ];
    for (label, key, ask) in cases {
        assert!(is_shape_label(label), "{label}");
        assert_eq!(read(label), Ok((key.to_owned(), ask)), "{label}");
    }
    for label in ["linux", "self-hosted", "r-cpu=4", "rm", "xrm-cpu=4"] {
        assert!(!is_shape_label(label), "{label}");
    }
}

#[test]
fn an_unreadable_label_is_named_with_the_form_that_would_be_read() {
    let cases = [
        ("rm-cpu=0", "0 CPUs is no CPU at all"),
        ("rm-cpu=1.2345", "`1.2345` is not a number of CPUs"),
        ("rm-cpu=-1", "`-1` is not a number of CPUs"),
        ("rm-cpu=1e3", "`1e3` is not a number of CPUs"),
        ("rm-cpu=", "`` is not a number of CPUs"),
        ("rm-cpu=2.", "`2.` is not a number of CPUs"),
        ("rm-cpu=99999999", "`99999999` is not a number of CPUs"),
        (
            "rm-mem=1.5g",
            "`1.5g` is not a size; write a whole number and a unit",
        ),
        ("rm-mem=32gb", "`32gb` is not a size"),
        ("rm-mem=32GiB", "`32GiB` is not a size"),
        // A bare number is never read as a size: gigabytes to one reader, bytes to another.
        ("rm-mem=1024", "`1024` is not a size"),
        ("rm-mem=g", "`g` is not a size"),
        ("rm-disk=0g", "`0g` is not a size"),
        ("rm-gpu=0", "asks 0 devices"),
        ("rm-gpu=x", "`x` is not a device count"),
        ("rm-gpu=+1", "`+1` is not a device count"),
        ("rm-shape=big!", "`big!` is not a shape name"),
        ("rm-large", "a shape label is rm-KEY=VALUE"),
        ("rm-", "a shape label is rm-KEY=VALUE"),
        ("rm-memory=8g", "`memory` is not a shape key"),
        ("rm-9x=1", "`9x` is not a shape key"),
        ("rm-a_very_long_group_name=1", "is not a shape key"),
    ];
    for (label, why) in cases {
        match read(label) {
            Err(problem) => assert!(problem.contains(why), "{label}: {problem}"),
            Ok(read) => panic!("{label} read as {read:?}"),
        }
        // Through resolution, the same label is refused by name.
        let refusal = resolve(&shaped(), &labels(&["linux", label])).unwrap_err();
        assert!(
            matches!(&refusal, Refusal::Unreadable { label: l, .. } if l == label),
            "{label}: {refusal:?}"
        );
    }
}

#[test]
fn a_repeated_key_is_unreadable_whatever_its_case() {
    for pair in [
        ["rm-cpu=2", "RM-CPU=4"],
        ["rm-gpu=1", "rm-gpu=1"],
        ["rm-shape=large", "rm-shape=small"],
    ] {
        let refusal = resolve(&shaped(), &labels(&pair)).unwrap_err();
        let Refusal::Unreadable { label, why } = &refusal else {
            panic!("{pair:?}: {refusal:?}");
        };
        assert_eq!(label, pair[1]);
        assert!(why.contains("repeats rm-"), "{why}");
    }
}

#[test]
fn labels_win_over_the_named_shape_which_wins_over_the_policy() {
    let policy = shaped();
    let devices = |pairs: &[(&str, u32)]| {
        pairs
            .iter()
            .map(|(g, n)| ((*g).to_owned(), *n))
            .collect::<BTreeMap<_, _>>()
    };
    // (labels, cpu, memory, disk, devices)
    let cases: [Resolved; 7] = [
        // No shape label: the policy's cpu; memory and disk left to memory_max and disk_max.
        (&["linux"], Some(2000), None, None, devices(&[])),
        (
            &["rm-shape=large"],
            Some(6000),
            Some(16 * GIB),
            Some(50 * GIB),
            devices(&[("gpu", 1)]),
        ),
        (&["rm-shape=small"], Some(1000), None, None, devices(&[])),
        // A named shape without a cpu keeps the policy's.
        (
            &["rm-shape=roomy"],
            Some(2000),
            Some(24 * GIB),
            None,
            devices(&[]),
        ),
        (
            &["rm-shape=large", "rm-cpu=8", "rm-gpu=2"],
            Some(8000),
            Some(16 * GIB),
            Some(50 * GIB),
            devices(&[("gpu", 2)]),
        ),
        (
            &["rm-mem=4g", "rm-shape=large"],
            Some(6000),
            Some(4 * GIB),
            Some(50 * GIB),
            devices(&[("gpu", 1)]),
        ),
        (
            &["RM-DISK=10G", "rm-fpga=1"],
            Some(2000),
            None,
            Some(10 * GIB),
            devices(&[("fpga", 1)]),
        ),
    ];
    for (job, cpu, memory, disk, devices) in cases {
        let shape = resolve(&policy, &labels(job)).unwrap();
        assert_eq!(shape.cpu_millis, cpu, "{job:?}");
        assert_eq!(shape.memory, memory, "{job:?}");
        assert_eq!(shape.disk, disk, "{job:?}");
        assert_eq!(shape.devices, devices, "{job:?}");
    }
}

#[test]
fn the_key_is_the_shape_labels_lowercased_and_sorted_and_the_labels_are_kept_as_written() {
    let shape = resolve(
        &shaped(),
        &labels(&["self-hosted", "RM-MEM=8g", "linux", "rm-cpu=2"]),
    )
    .unwrap();
    assert_eq!(shape.labels, labels(&["RM-MEM=8g", "rm-cpu=2"]));
    assert_eq!(shape.key, "rm-cpu=2,rm-mem=8g");
    let none = resolve(&shaped(), &labels(&["linux"])).unwrap();
    assert_eq!(none.key, "");
    assert!(none.labels.is_empty());
}

#[test]
fn what_the_policy_does_not_offer_is_refused_with_the_fix() {
    let unshaped = policy("cpu = 2");
    let only_named = policy("[[policy.shape]]\nname = \"large\"\ncpu = 4\n");
    let cases: [(&Policy, &[&str], Refusal); 9] = [
        (
            &unshaped,
            &["linux", "rm-cpu=4"],
            Refusal::NoShapes {
                label: "rm-cpu=4".to_owned(),
            },
        ),
        (
            &only_named,
            &["rm-cpu=4"],
            Refusal::NoMax {
                label: "rm-cpu=4".to_owned(),
            },
        ),
        (
            &only_named,
            &["rm-shape=large", "rm-mem=1g"],
            Refusal::NoMax {
                label: "rm-mem=1g".to_owned(),
            },
        ),
        (
            &only_named,
            &["rm-shape=huge"],
            Refusal::UnknownShape {
                name: "huge".to_owned(),
                known: vec!["large".to_owned()],
            },
        ),
        (
            &shaped(),
            &["rm-cpu=8.5"],
            Refusal::OverMax {
                what: "cpu".to_owned(),
                asked: "8.5".to_owned(),
                max: "8".to_owned(),
            },
        ),
        (
            &shaped(),
            &["rm-mem=33g"],
            Refusal::OverMax {
                what: "memory".to_owned(),
                asked: "33G".to_owned(),
                max: "32G".to_owned(),
            },
        ),
        (
            &shaped(),
            &["rm-shape=large", "rm-disk=101g"],
            Refusal::OverMax {
                what: "disk".to_owned(),
                asked: "101G".to_owned(),
                max: "100G".to_owned(),
            },
        ),
        (
            &shaped(),
            &["rm-gpu=3"],
            Refusal::OverMax {
                what: "gpu".to_owned(),
                asked: "3".to_owned(),
                max: "2".to_owned(),
            },
        ),
        // Unreadable comes before what the policy offers: the label is wrong anywhere.
        (
            &unshaped,
            &["rm-cpu=x"],
            Refusal::Unreadable {
                label: "rm-cpu=x".to_owned(),
                why: "`x` is not a number of CPUs; write it like rm-cpu=4 or rm-cpu=0.5 (at most 3 digits after the point)".to_owned(),
            },
        ),
    ];
    for (policy, job, want) in cases {
        assert_eq!(resolve(policy, &labels(job)), Err(want), "{job:?}");
    }
    // Without shape_max, named shapes and devices (up to the host's count) are allowed.
    let picked = resolve(&only_named, &labels(&["rm-shape=large", "rm-gpu=2"])).unwrap();
    assert_eq!(picked.cpu_millis, Some(4000));
    assert_eq!(picked.devices.get("gpu"), Some(&2));
    // A policy without shapes still resolves its own cpu for a job asking nothing.
    assert_eq!(
        resolve(&unshaped, &labels(&["linux"])).unwrap().cpu_millis,
        Some(2000)
    );
}

#[test]
fn each_refusal_reads_as_one_sentence_with_its_fix() {
    let cases = [
        (
            Refusal::NoShapes {
                label: "rm-cpu=4".to_owned(),
            },
            "declare them in the policy or drop the label",
        ),
        (
            Refusal::UnknownShape {
                name: "huge".to_owned(),
                known: vec!["large".to_owned(), "small".to_owned()],
            },
            "(its shapes: large, small); pick one of them with rm-shape=NAME or add a [[policy.shape]] named `huge`",
        ),
        (
            Refusal::OverMax {
                what: "cpu".to_owned(),
                asked: "12".to_owned(),
                max: "8".to_owned(),
            },
            "the job asks cpu 12, more than the policy's shape_max.cpu (8); ask for at most 8 or raise shape_max.cpu",
        ),
    ];
    for (refusal, text) in cases {
        let shown = refusal.to_string();
        assert!(shown.contains(text), "{shown}");
        assert!(!shown.contains('\n'), "{shown}");
    }
}

#[test]
fn a_written_size_is_reserved_as_written_and_the_rest_takes_an_even_share() {
    let capacity = HostCapacity {
        cpu_millis: Some(8000),
        memory: Some(32 * GIB),
        disk: Some(200 * GIB),
    };
    let unbounded = HostCapacity::default();
    let plain = policy("");
    let written_bounds = policy("memory_max = \"6G\"\ndisk_max = \"20G\"");
    let shape = |job: &[&str]| resolve(&shaped(), &labels(job)).unwrap();
    let nothing = resolve(&plain, &labels(&["linux"])).unwrap();
    let cases = [
        // No shape, no written bounds: a quarter of each (max_runners = 4), as max_runners
        // alone packed the host. The default memory_max and disk_max do not count.
        (
            &nothing,
            &plain,
            &capacity,
            4,
            Size {
                cpu_millis: 2000,
                memory: 8 * GIB,
                disk: 50 * GIB,
            },
        ),
        // A written memory_max and disk_max count as the runner's size.
        (
            &nothing,
            &written_bounds,
            &capacity,
            4,
            Size {
                cpu_millis: 2000,
                memory: 6 * GIB,
                disk: 20 * GIB,
            },
        ),
        // A shape's written sizes win over the policy's bounds.
        (
            &shape(&["rm-shape=large"]),
            &written_bounds,
            &capacity,
            4,
            Size {
                cpu_millis: 6000,
                memory: 16 * GIB,
                disk: 50 * GIB,
            },
        ),
        // Only the cpu written (the policy's): memory and disk an even share of 2 runners.
        (
            &shape(&["linux"]),
            &plain,
            &capacity,
            2,
            Size {
                cpu_millis: 2000,
                memory: 16 * GIB,
                disk: 100 * GIB,
            },
        ),
        // Unbounded capacity: nothing counted where nothing is written, written sizes kept.
        (
            &shape(&["rm-mem=3g"]),
            &plain,
            &unbounded,
            4,
            Size {
                cpu_millis: 2000,
                memory: 3 * GIB,
                disk: 0,
            },
        ),
        // max_runners 0 counts as 1 (never a division by zero).
        (
            &nothing,
            &plain,
            &capacity,
            0,
            Size {
                cpu_millis: 8000,
                memory: 32 * GIB,
                disk: 200 * GIB,
            },
        ),
    ];
    for (shape, policy, capacity, max_runners, want) in cases {
        assert_eq!(
            reservation(shape, policy, capacity, max_runners),
            want,
            "{:?} on {capacity:?}",
            shape.labels
        );
    }
}

#[test]
fn a_shape_beyond_the_host_says_which_dimension_and_by_how_much() {
    let capacity = HostCapacity {
        cpu_millis: Some(8000),
        memory: Some(32 * GIB),
        disk: Some(200 * GIB),
    };
    let device = |group: &str, node: &str| Device {
        group: group.to_owned(),
        nodes: vec![PathBuf::from(node)],
        shared_nodes: Vec::new(),
    };
    let devices = [
        device("gpu", "/dev/nvidia0"),
        device("fpga", "/dev/fpga0"),
        device("gpu", "/dev/nvidia1"),
    ];
    let size = |cpu_millis, memory, disk| Size {
        cpu_millis,
        memory,
        disk,
    };
    let asking = |pairs: &[(&str, u32)]| Shape {
        devices: pairs.iter().map(|(g, n)| ((*g).to_owned(), *n)).collect(),
        ..Shape::default()
    };
    let fits = size(8000, 32 * GIB, 200 * GIB);
    let cases = [
        (fits, asking(&[("gpu", 2), ("fpga", 1)]), &capacity, None),
        (
            size(8001, GIB, GIB),
            asking(&[]),
            &capacity,
            Some(
                "it asks 8.001 CPUs, more than this host's capacity of 8 CPUs (host.capacity.cpu)",
            ),
        ),
        (
            size(1000, 33 * GIB, GIB),
            asking(&[]),
            &capacity,
            Some(
                "it asks 33G of memory, more than this host's capacity of 32G (host.capacity.memory)",
            ),
        ),
        (
            size(1000, GIB, 201 * GIB),
            asking(&[]),
            &capacity,
            Some(
                "it asks 201G of disk, more than this host's capacity of 200G (host.capacity.disk)",
            ),
        ),
        (
            fits,
            asking(&[("gpu", 3)]),
            &capacity,
            Some("it asks 3 `gpu` devices, more than the 2 this host has ([[host.device]])"),
        ),
        (
            fits,
            asking(&[("tpu", 1)]),
            &capacity,
            Some(
                "it asks 1 `tpu` devices, and this host has no device of group `tpu` (its groups: fpga, gpu)",
            ),
        ),
        // Unbounded capacity never refuses a size.
        (
            size(u64::MAX, u64::MAX, u64::MAX),
            asking(&[]),
            &HostCapacity::default(),
            None,
        ),
    ];
    for (size, shape, capacity, want) in cases {
        assert_eq!(
            exceeds_host(&size, &shape, capacity, &devices).as_deref(),
            want,
            "{size:?} {:?}",
            shape.devices
        );
    }
    assert_eq!(
        exceeds_host(&fits, &asking(&[("gpu", 1)]), &capacity, &[]).as_deref(),
        Some(
            "it asks 1 `gpu` devices, and this host has no device of group `gpu` (it has no [[host.device]])"
        )
    );
}
