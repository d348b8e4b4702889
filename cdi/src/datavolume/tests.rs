//! Every phase transition and every terminal path of [`decide`], and the rendered pods.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    PersistentVolumeClaim, PersistentVolumeClaimStatus, Pod, PodCondition, PodStatus,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::clone;
use super::pod::SourceRefs;
use super::*;
use crate::settings::{Config, RetryPolicy, UploadTls, default_resources};
use api::datavolume::condition;
use api::datavolume::{
    DataVolumeSource, Empty, SourceGcs, SourceHttp, SourceRegistry, SourceS3, StorageSpec,
};
use api::{DataVolumeSpec, Phase};

const UID: &str = "6b2f2c1e-0000-4000-8000-000000000001";
const SHA: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn storage(size: &str) -> Option<StorageSpec> {
    Some(StorageSpec {
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn dv_with(source: DataVolumeSource) -> DataVolume {
    let mut dv = DataVolume::new(
        "fedora",
        DataVolumeSpec {
            source: Some(source),
            storage: storage("1Gi"),
            ..Default::default()
        },
    );
    dv.metadata.namespace = Some("vms".into());
    dv.metadata.uid = Some(UID.into());
    dv
}

fn http_dv() -> DataVolume {
    dv_with(DataVolumeSource {
        http: Some(SourceHttp {
            url: "https://images.example/fedora.qcow2".into(),
            checksum: Some(SHA.into()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn upload_dv() -> DataVolume {
    dv_with(DataVolumeSource {
        upload: Some(Empty {}),
        ..Default::default()
    })
}

fn pvc(phase: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        status: Some(PersistentVolumeClaimStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod_in(phase: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("importer-fedora".into());
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    p
}

fn waiting(reason: &str) -> Pod {
    let mut p = pod_in("Pending");
    p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    p
}

fn exited(code: i32, log: &str) -> Pod {
    let mut p = pod_in(if code == 0 { "Succeeded" } else { "Failed" });
    p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                message: Some(log.into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    p
}

fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn obs<'a>(pvc: Option<&'a PersistentVolumeClaim>, pod: Option<&'a Pod>) -> Observed<'a> {
    Observed {
        pvc,
        pod,
        service: false,
        wait_for_first_consumer: false,
        csi_class: Some(false),
        progress: None,
        refs: SourceRefs::default(),
        storage: Default::default(),
        source_ref: None,
        clone: Default::default(),
        refused: None,
        now: t0(),
    }
}

/// Applies a decision's status to the DataVolume, as the controller's status patch does.
fn step(dv: &mut DataVolume, o: &Observed<'_>, cfg: &Config) -> Decision {
    let d = decide(dv, o, cfg);
    dv.status = Some(d.status.clone());
    d
}

fn cond<'a>(d: &'a Decision, t: &str) -> &'a api::datavolume::DataVolumeCondition {
    status::find(&d.status.conditions, t).unwrap_or_else(|| panic!("no {t} condition"))
}

pub(super) fn events(d: &Decision) -> Vec<(bool, String)> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(e) => Some((e.warning, e.reason.clone())),
            _ => None,
        })
        .collect()
}

fn created_pod(d: &Decision) -> &Pod {
    d.actions
        .iter()
        .find_map(|a| match a {
            Action::CreatePod(p) => Some(&**p),
            _ => None,
        })
        .expect("a CreatePod action")
}

fn args(p: &Pod) -> Vec<String> {
    p.spec.as_ref().unwrap().containers[0].args.clone().unwrap()
}

#[test]
fn a_new_datavolume_creates_its_pvc_and_is_pending() {
    let cfg = Config::default();
    let mut dv = http_dv();
    let d = step(&mut dv, &obs(None, None), &cfg);
    assert!(
        matches!(&d.actions[..], [Action::CreatePvc(p)] if p.metadata.name.as_deref() == Some("fedora"))
    );
    assert_eq!(d.status.phase, Some(Phase::Pending));
    assert_eq!(d.status.progress.as_deref(), Some("N/A"));
    assert_eq!(d.status.restart_count, Some(0));
    assert_eq!(d.status.claim_name.as_deref(), Some("fedora"));
    let b = cond(&d, "Bound");
    assert_eq!(
        (b.status.as_str(), b.reason.as_deref()),
        ("False", Some("Pending"))
    );
    assert_eq!(cond(&d, "Ready").status, "False");
    assert_eq!(cond(&d, "Running").status, "False");
}

#[test]
fn a_pending_pvc_is_waited_for() {
    let cfg = Config::default();
    let mut dv = http_dv();
    let p = pvc("Pending");
    let d = step(&mut dv, &obs(Some(&p), None), &cfg);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.status.phase, Some(Phase::Pending));
}

#[test]
fn wait_for_first_consumer_is_honoured_or_the_importer_binds_the_pvc() {
    let mut cfg = Config::default();
    let mut dv = http_dv();
    let p = pvc("Pending");
    let o = Observed {
        wait_for_first_consumer: true,
        ..obs(Some(&p), None)
    };
    let d = step(&mut dv, &o, &cfg);
    assert!(d.actions.is_empty());
    assert_eq!(d.status.phase, Some(Phase::WaitForFirstConsumer));
    assert_eq!(
        cond(&d, "Running").reason.as_deref(),
        Some("WaitForFirstConsumer")
    );

    // a DataImportCron's import asks to bind at once: the importer is its first consumer
    let mut immediate = dv.clone();
    immediate.metadata.annotations =
        Some([(super::ANN_IMMEDIATE_BINDING.to_string(), "true".to_string())].into());
    let d = step(&mut immediate, &o, &cfg);
    created_pod(&d);
    assert_eq!(d.status.phase, Some(Phase::Pending));

    cfg.honor_wait_for_first_consumer = false;
    let d = step(&mut dv, &o, &cfg);
    created_pod(&d);
    assert_eq!(d.status.phase, Some(Phase::Pending));
}

#[test]
fn the_full_import_sequence_with_cdi_phases_events_and_conditions() {
    let cfg = Config::default();
    let mut dv = http_dv();
    let bound = pvc("Bound");

    let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
    assert_eq!(d.status.phase, Some(Phase::PvcBound));
    assert_eq!(cond(&d, "Bound").reason.as_deref(), Some("Bound"));
    assert_eq!(
        cond(&d, "Bound").message.as_deref(),
        Some("PVC fedora Bound")
    );
    let p = created_pod(&d);
    assert_eq!(p.metadata.name.as_deref(), Some("importer-fedora"));
    assert_eq!(d.actions.len(), 1);

    let pending = waiting("ContainerCreating");
    let d = step(&mut dv, &obs(Some(&bound), Some(&pending)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::ImportScheduled));
    assert_eq!(events(&d), [(false, "ImportScheduled".to_string())]);
    assert_eq!(
        cond(&d, "Running").reason.as_deref(),
        Some("ContainerCreating")
    );
    // No second event for the same phase.
    let d = step(&mut dv, &obs(Some(&bound), Some(&pending)), &cfg);
    assert!(events(&d).is_empty());

    let running = pod_in("Running");
    let o = Observed {
        progress: Some(45.5),
        ..obs(Some(&bound), Some(&running))
    };
    let d = step(&mut dv, &o, &cfg);
    assert_eq!(d.status.phase, Some(Phase::ImportInProgress));
    assert_eq!(d.status.progress.as_deref(), Some("45.50%"));
    assert_eq!(events(&d), [(false, "ImportInProgress".to_string())]);
    assert_eq!(cond(&d, "Running").status, "True");
    assert_eq!(
        cond(&d, "Running").reason.as_deref(),
        Some("Pod is running")
    );
    assert_eq!(cond(&d, "Ready").reason.as_deref(), Some("TransferRunning"));
    assert_eq!(d.requeue, Some(cfg.progress_interval));
    // Progress unknown for a moment: the last value stays.
    let d = step(&mut dv, &obs(Some(&bound), Some(&running)), &cfg);
    assert_eq!(d.status.progress.as_deref(), Some("45.50%"));

    let done = exited(0, "");
    let d = step(&mut dv, &obs(Some(&bound), Some(&done)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    assert_eq!(d.status.progress.as_deref(), Some("100.00%"));
    assert_eq!(cond(&d, "Ready").status, "True");
    assert_eq!(cond(&d, "Running").reason.as_deref(), Some("Completed"));
    assert_eq!(
        cond(&d, "Running").message.as_deref(),
        Some("Import Complete")
    );
    assert_eq!(events(&d), [(false, "ImportSucceeded".to_string())]);
    assert!(
        d.actions
            .contains(&Action::DeletePod("importer-fedora".into()))
    );
    assert_eq!(d.status.restart_count, Some(0));

    // Finished: a pod still listed is removed, nothing else changes.
    let d = step(&mut dv, &obs(Some(&bound), Some(&done)), &cfg);
    assert_eq!(d.actions, [Action::DeletePod("importer-fedora".into())]);
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
    assert!(d.actions.is_empty());
}

#[test]
fn checkpoints_of_a_single_stage_source_are_ignored_as_cdis_populators_ignore_them() {
    let cfg = Config::default();
    let with_checkpoints = |mut dv: DataVolume| {
        dv.spec.checkpoints = vec![api::datavolume::DataVolumeCheckpoint {
            previous: String::new(),
            current: "snapshot-1".into(),
        }];
        dv.spec.final_checkpoint = Some(false);
        dv
    };
    // One import, not a stage: Succeeded (never CDI's multi-stage Paused), the argv as without.
    let mut dv = with_checkpoints(http_dv());
    let bound = pvc("Bound");
    let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
    let plain = decide(&http_dv(), &obs(Some(&bound), None), &cfg);
    assert_eq!(args(created_pod(&d)), args(created_pod(&plain)));
    let d = step(&mut dv, &obs(Some(&bound), Some(&exited(0, ""))), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    // On a CSI class the VolumeImportSource carries none (CDI's only for vddk and imageio).
    let d = decide(&with_checkpoints(http_dv()), &on_csi(None), &cfg);
    let import_source = d.actions.iter().find_map(|a| match a {
        Action::CreatePopulatorSource(s) => match &**s {
            populated::PopulatorSource::Import(_, spec) => Some(spec),
            _ => None,
        },
        _ => None,
    });
    let spec = import_source.expect("a VolumeImportSource");
    assert!(spec.checkpoints.is_empty() && spec.final_checkpoint.is_none());
}

#[test]
fn every_terminal_exit_code_fails_at_once_without_restarts() {
    let cfg = Config::default();
    for (code, why) in super::retry::TERMINAL_EXIT_CODES {
        let mut dv = http_dv();
        let bound = pvc("Bound");
        step(&mut dv, &obs(Some(&bound), None), &cfg);
        let failed = exited(code, "{\"error\":\"boom\"}\nerror: the details\n");
        let d = step(&mut dv, &obs(Some(&bound), Some(&failed)), &cfg);
        assert_eq!(d.status.phase, Some(Phase::Failed), "{code}");
        assert_eq!(d.status.restart_count, Some(0));
        assert_eq!(cond(&d, "Running").reason.as_deref(), Some(why));
        assert_eq!(cond(&d, "Ready").reason.as_deref(), Some(why));
        let msg = cond(&d, "Running").message.clone().unwrap();
        assert!(
            msg.contains("the details") && msg.contains("not retried"),
            "{msg}"
        );
        assert_eq!(events(&d), [(true, "ImportFailed".to_string())]);
        assert!(
            d.actions
                .contains(&Action::DeletePod("importer-fedora".into()))
        );
        assert_eq!(d.requeue, None);
        // Failed stays failed: no new pod.
        let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
        assert!(d.actions.is_empty());
    }
}

#[test]
fn retryable_failures_back_off_then_restart_then_give_up() {
    let cfg = Config {
        retry: RetryPolicy {
            base_delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(15),
            max_restarts: 2,
        },
        ..Config::default()
    };
    let mut dv = http_dv();
    let bound = pvc("Bound");
    step(&mut dv, &obs(Some(&bound), None), &cfg);
    step(&mut dv, &obs(Some(&bound), Some(&pod_in("Running"))), &cfg);

    let failed = exited(20, "error: source unavailable: connection reset");
    let d = step(&mut dv, &obs(Some(&bound), Some(&failed)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::ImportInProgress));
    assert_eq!(d.status.restart_count, Some(1));
    assert_eq!(d.requeue, Some(Duration::from_secs(10)));
    assert_eq!(
        cond(&d, "Running").reason.as_deref(),
        Some("SourceUnavailable")
    );
    assert_eq!(events(&d), [(true, "ImportRetrying".to_string())]);
    assert!(
        d.actions
            .contains(&Action::DeletePod("importer-fedora".into()))
    );

    // Within the back-off: nothing but a requeue for the rest of it.
    let later = Observed {
        now: t0() + SignedDuration::from_secs(4),
        ..obs(Some(&bound), None)
    };
    let d = step(&mut dv, &later, &cfg);
    assert!(d.actions.is_empty());
    assert_eq!(d.requeue, Some(Duration::from_secs(6)));
    // After it: a new pod, same phase.
    let after = Observed {
        now: t0() + SignedDuration::from_secs(10),
        ..obs(Some(&bound), None)
    };
    let d = step(&mut dv, &after, &cfg);
    created_pod(&d);
    assert_eq!(d.status.phase, Some(Phase::ImportInProgress));
    // The new pod, not started yet, leaves the failure's reason in Running (not "Pending").
    let d = step(&mut dv, &obs(Some(&bound), Some(&pod_in("Pending"))), &cfg);
    assert_eq!(
        cond(&d, "Running").reason.as_deref(),
        Some("SourceUnavailable")
    );

    // Second failure (exit 21) waits the capped delay; the third gives up.
    let d = step(
        &mut dv,
        &obs(Some(&bound), Some(&exited(21, "error: io"))),
        &cfg,
    );
    assert_eq!(
        (d.status.restart_count, d.requeue),
        (Some(2), Some(Duration::from_secs(15)))
    );
    let d = step(&mut dv, &obs(Some(&bound), Some(&exited(137, ""))), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    // The final failure has its own reason, so it never folds into the retries' events.
    assert_eq!(events(&d), [(true, "ImportFailed".to_string())]);
    assert_eq!(d.status.restart_count, Some(2));
    assert_eq!(cond(&d, "Running").reason.as_deref(), Some("Error"));
    assert!(
        cond(&d, "Running")
            .message
            .as_deref()
            .unwrap()
            .contains("giving up after 2 restarts")
    );
}

#[test]
fn an_invalid_spec_fails_before_creating_anything() {
    let cfg = Config::default();
    let mut dv = dv_with(DataVolumeSource {
        http: Some(SourceHttp {
            url: "https://h/x".into(),
            checksum: Some("crc32:00".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    dv.metadata.generation = Some(3);
    let d = step(&mut dv, &obs(None, None), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    assert_eq!(cond(&d, "Ready").reason.as_deref(), Some("InvalidSpec"));
    // Progress unknown, not empty; the status says which generation it is about.
    assert_eq!(d.status.progress.as_deref(), Some("N/A"));
    assert_eq!(d.status.observed_generation, Some(3));
    assert!(
        matches!(&d.actions[..], [Action::Event(e)] if e.reason == "DataVolumeFailed" && e.warning)
    );
}

#[test]
fn a_lost_claim_fails_the_datavolume() {
    let cfg = Config::default();
    let mut dv = http_dv();
    let lost = pvc("Lost");
    let d = step(&mut dv, &obs(Some(&lost), None), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    assert_eq!(cond(&d, "Bound").reason.as_deref(), Some("ClaimLost"));
    assert_eq!(events(&d), [(true, "ErrClaimLost".to_string())]);
}

#[test]
fn the_upload_sequence_creates_pod_and_service_and_removes_both() {
    let cfg = Config::default();
    let mut dv = upload_dv();
    let bound = pvc("Bound");
    let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
    assert_eq!(d.status.phase, Some(Phase::PvcBound));
    let p = created_pod(&d);
    assert_eq!(p.metadata.name.as_deref(), Some("cdi-upload-fedora"));
    let svc = d
        .actions
        .iter()
        .find_map(|a| match a {
            Action::CreateService(s) => Some(s),
            _ => None,
        })
        .unwrap();
    assert_eq!(svc.metadata.name.as_deref(), Some("cdi-upload-fedora"));

    fn with_svc<'a>(pvc: &'a PersistentVolumeClaim, pod: Option<&'a Pod>) -> Observed<'a> {
        Observed {
            service: true,
            ..obs(Some(pvc), pod)
        }
    }
    let mut up = pod_in("Running");
    up.metadata.name = Some("cdi-upload-fedora".into());
    let d = step(&mut dv, &with_svc(&bound, Some(&up)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::UploadScheduled));
    assert_eq!(events(&d), [(false, "UploadScheduled".to_string())]);
    up.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: "Ready".into(),
        status: "True".into(),
        ..Default::default()
    }]);
    let d = step(&mut dv, &with_svc(&bound, Some(&up)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::UploadReady));
    assert_eq!(events(&d), [(false, "UploadReady".to_string())]);

    // the server stops being ready while it writes out a finished upload: no step back
    up.status.as_mut().unwrap().conditions = None;
    let d = step(&mut dv, &with_svc(&bound, Some(&up)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::UploadReady));
    assert!(events(&d).is_empty(), "{:?}", events(&d));

    let mut done = exited(0, "");
    done.metadata.name = Some("cdi-upload-fedora".into());
    let d = step(&mut dv, &with_svc(&bound, Some(&done)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    assert_eq!(events(&d), [(false, "UploadSucceeded".to_string())]);
    assert!(
        d.actions
            .contains(&Action::DeletePod("cdi-upload-fedora".into()))
    );
    assert!(
        d.actions
            .contains(&Action::DeleteService("cdi-upload-fedora".into()))
    );
}

#[test]
fn importer_pod_for_http_with_credentials_ca_headers_and_checksum() {
    let cfg = Config {
        image: "registry.local/quarry:1".into(),
        ..Config::default()
    };
    let mut dv = dv_with(DataVolumeSource {
        http: Some(SourceHttp {
            url: "https://images.example/f.qcow2".into(),
            secret_ref: Some("creds".into()),
            cert_config_map: Some("ca".into()),
            extra_headers: vec!["X-Auth: t1".into()],
            secret_extra_headers: vec!["hdrs".into()],
            checksum: Some(SHA.into()),
        }),
        ..Default::default()
    });
    dv.spec.preallocation = Some(true);
    let refs = SourceRefs {
        ca_keys: vec!["ca.pem".into()],
        header_secrets: vec![("hdrs".into(), vec!["h1".into()])],
        ..SourceRefs::default()
    };
    let bound = pvc("Bound");
    let o = Observed {
        refs,
        ..obs(Some(&bound), None)
    };
    let d = decide(&dv, &o, &cfg);
    let p = created_pod(&d);
    let spec = p.spec.as_ref().unwrap();
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some("registry.local/quarry:1"));
    assert_eq!(c.command.as_deref(), Some(&["quarry".to_string()][..]));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        args(p),
        [
            "import",
            "https://images.example/f.qcow2",
            "/data/disk.img",
            "--size",
            "1136234735",
            "--filesystem-overhead",
            "0.055",
            "--checksum",
            SHA,
            "--ca-cert",
            "/certs/ca.pem",
            "--user=$(IMPORTER_ACCESS_KEY_ID)",
            "--password-file",
            "/secret/secretKey",
            "--header",
            "X-Auth: t1",
            "--header=$(IMPORTER_SECRET_HEADER_0)",
            "--preallocate",
            "--metrics-addr",
            "0.0.0.0:8443",
            "--owner-uid",
            UID,
            "--json",
        ]
    );
    let env = c.env.as_ref().unwrap();
    let key = |v: &str| {
        let e = env.iter().find(|e| e.name == v).unwrap();
        let r = e
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        (r.name.clone(), r.key.clone())
    };
    assert_eq!(
        key("IMPORTER_ACCESS_KEY_ID"),
        ("creds".into(), "accessKeyId".into())
    );
    assert_eq!(
        key("IMPORTER_SECRET_HEADER_0"),
        ("hdrs".into(), "h1".into())
    );
    let vols = spec.volumes.as_ref().unwrap();
    let vol = |n: &str| vols.iter().find(|v| v.name == n).unwrap();
    assert_eq!(
        vol("cdi-data-vol")
            .persistent_volume_claim
            .as_ref()
            .unwrap()
            .claim_name,
        "fedora"
    );
    assert_eq!(vol("cdi-cert-vol").config_map.as_ref().unwrap().name, "ca");
    assert_eq!(
        vol("cdi-secret-vol")
            .secret
            .as_ref()
            .unwrap()
            .secret_name
            .as_deref(),
        Some("creds")
    );
    let mounts: Vec<_> = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect();
    assert!(mounts.contains(&("cdi-data-vol", "/data")), "{mounts:?}");
    let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("DataVolume", UID, Some(true))
    );
    assert_eq!(
        p.spec.as_ref().unwrap().automount_service_account_token,
        Some(false),
        "no API token: the importer never calls the API"
    );
}

#[test]
fn importer_pod_for_registry_s3_blank_and_block_volumes() {
    let cfg = Config {
        insecure_registries: vec!["registry.local:5000".into()],
        ..Config::default()
    };
    let bound = pvc("Bound");
    let o = obs(Some(&bound), None);

    let mut reg = dv_with(DataVolumeSource {
        registry: Some(Box::new(SourceRegistry {
            url: Some("docker://registry.local:5000/vm/disk:v1".into()),
            secret_ref: Some("pull".into()),
            platform: Some(api::datavolume::PlatformOptions {
                architecture: Some("arm64".into()),
            }),
            ..Default::default()
        })),
        ..Default::default()
    });
    reg.spec.storage.as_mut().unwrap().volume_mode = Some("Block".into());
    let d = decide(&reg, &o, &cfg);
    let p = created_pod(&d);
    let a = args(p);
    assert_eq!(
        &a[..5],
        [
            "import",
            "docker://registry.local:5000/vm/disk:v1",
            "/dev/cdi-block-volume",
            "--size",
            "1073741824"
        ]
    );
    assert!(!a.contains(&"--filesystem-overhead".to_string()));
    for want in [
        "--insecure",
        "linux/arm64",
        "--user=$(IMPORTER_ACCESS_KEY_ID)",
        "/secret/secretKey",
    ] {
        assert!(a.contains(&want.to_string()), "{want} in {a:?}");
    }
    let c = &p.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        c.volume_devices.as_ref().unwrap()[0].device_path,
        "/dev/cdi-block-volume"
    );

    let s3 = dv_with(DataVolumeSource {
        s3: Some(Box::new(SourceS3 {
            url: "https://s3.local/bucket/disk.img".into(),
            secret_ref: Some("keys".into()),
            cert_config_map: None,
        })),
        ..Default::default()
    });
    let a = args(created_pod(&decide(&s3, &o, &cfg)));
    let joined = a.join(" ");
    assert!(joined.contains("--s3-credentials /secret --s3"), "{joined}");
    assert!(!joined.contains("--user"), "{joined}");

    // A gcs source's Secret is mounted where CDI mounts it; its key file goes to the importer.
    let gcs = dv_with(DataVolumeSource {
        gcs: Some(Box::new(SourceGcs {
            url: "https://storage.googleapis.com/bucket/disk.img".into(),
            secret_ref: Some("sa-key".into()),
        })),
        ..Default::default()
    });
    let d = decide(&gcs, &o, &cfg);
    let p = created_pod(&d);
    let joined = args(p).join(" ");
    let key = "--gcs-credentials /google/credentials.json --gcs";
    assert!(joined.contains(key), "{joined}");
    let mounts = p.spec.as_ref().unwrap().containers[0].volume_mounts.clone();
    let secret = mounts
        .unwrap()
        .into_iter()
        .find(|m| m.name == "cdi-secret-vol");
    assert_eq!(secret.map(|m| m.mount_path).as_deref(), Some("/google"));

    let blank = dv_with(DataVolumeSource {
        blank: Some(Empty {}),
        ..Default::default()
    });
    let a = args(created_pod(&decide(&blank, &o, &cfg)));
    assert_eq!(&a[..3], ["import", "/dev/null", "/data/disk.img"]);
}

#[test]
fn an_upload_pod_with_issued_tls_mounts_its_own_secret_and_requires_the_proxy_client_ca() {
    let cfg = Config {
        upload_tls: Some(UploadTls::Issued {
            namespace: "quarry".into(),
        }),
        ..Config::default()
    };
    let dv = upload_dv();
    let claim = pvc::claim(&dv, &cfg, &pvc::StorageDefaults::Builtin).unwrap();
    let p = pod::upload_pod(&pod::Workload::of(&dv), &claim, &cfg, "pvc-uid", false);
    assert_eq!(
        args(&p)[9..],
        [
            "--tls-cert",
            "/tls/tls.crt",
            "--tls-key",
            "/tls/tls.key",
            "--client-ca",
            "/tls/ca.crt"
        ]
    );
    let vols = p.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    let secret_name = pod::upload_name(dv.metadata.name.as_deref().unwrap());
    assert!(vols.iter().any(|v| v.name == "cdi-upload-tls"
        && v.secret.as_ref().unwrap().secret_name.as_deref() == Some(secret_name.as_str())));
}

#[test]
fn upload_pod_runs_the_upload_server_with_tls_and_the_service_maps_443() {
    let cfg = Config {
        upload_tls: Some(UploadTls::Shared {
            secret: "upload-tls".into(),
            client_ca_config_map: Some("proxy-ca".into()),
        }),
        ..Config::default()
    };
    let dv = upload_dv();
    let claim = pvc::claim(&dv, &cfg, &Default::default()).unwrap();
    let p = pod::upload_pod(&pod::Workload::of(&dv), &claim, &cfg, "pvc-uid", false);
    assert_eq!(
        p.spec.as_ref().unwrap().automount_service_account_token,
        Some(false),
        "no API token: the server never calls the API"
    );
    assert_eq!(
        args(&p),
        [
            "upload-server",
            "--target",
            "/data/disk.img",
            "--size",
            "1136234735",
            "--filesystem-overhead",
            "0.055",
            "--listen",
            "0.0.0.0:8443",
            "--tls-cert",
            "/tls/tls.crt",
            "--tls-key",
            "/tls/tls.key",
            "--client-ca",
            "/client-ca/ca.crt",
        ]
    );
    let vols = p.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    assert!(vols.iter().any(|v| v.name == "cdi-upload-tls"
        && v.secret.as_ref().unwrap().secret_name.as_deref() == Some("upload-tls")));
    let labels = p.metadata.labels.as_ref().unwrap();
    let svc = pod::upload_service(&pod::Workload::of(&dv), "pvc-uid");
    let spec = svc.spec.unwrap();
    assert_eq!(
        spec.publish_not_ready_addresses,
        Some(true),
        "routed to before the readiness probe passes (clients retry a refused connection)"
    );
    let sel = spec.selector.unwrap();
    assert_eq!(sel[super::LABEL_TARGET], "pvc-uid");
    assert_eq!(
        p.spec.as_ref().unwrap().containers[0]
            .ports
            .as_ref()
            .unwrap()[0]
            .name
            .as_deref(),
        Some("https"),
        "TLS upload servers name their port https"
    );
    for (k, v) in &sel {
        assert_eq!(labels.get(k), Some(v), "the Service selects the pod");
    }
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.port, 443);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8443))
    );
    // the upload proxy's default upstream (https://cdi-upload-{pvc}.{namespace}.svc) dials this
    // port; the cluster suite's uploads through the proxy Service hold the two together
}

#[test]
fn a_failed_upload_server_is_restarted_with_its_service_kept() {
    let cfg = Config::default();
    let mut dv = upload_dv();
    let bound = pvc("Bound");
    step(&mut dv, &obs(Some(&bound), None), &cfg);
    let mut failed = exited(1, "error: listener died");
    failed.metadata.name = Some("cdi-upload-fedora".into());
    let o = Observed {
        service: true,
        ..obs(Some(&bound), Some(&failed))
    };
    let d = step(&mut dv, &o, &cfg);
    assert_eq!(d.status.restart_count, Some(1));
    assert_eq!(events(&d), [(true, "UploadRetrying".to_string())]);
    assert!(
        d.actions
            .contains(&Action::DeletePod("cdi-upload-fedora".into()))
    );
    // After the back-off a new server pod; the Service still exists, so it is not recreated.
    let later = Observed {
        service: true,
        now: t0() + SignedDuration::from_secs(60),
        ..obs(Some(&bound), None)
    };
    let d = step(&mut dv, &later, &cfg);
    assert_eq!(
        created_pod(&d).metadata.name.as_deref(),
        Some("cdi-upload-fedora")
    );
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::CreateService(_)))
    );
}

#[test]
fn a_refused_pod_sets_running_with_the_apis_message_once_and_backs_off() {
    let cfg = Config::default();
    let mut dv = http_dv();
    let bound = pvc("Bound");
    let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
    assert!(created_pod(&d).metadata.name.is_some());
    let message = "pods \"importer-fedora\" is forbidden: exceeded quota: q";
    let refused = |attempt, at| Observed {
        refused: Some(decide::PodRefusal {
            attempt,
            message: message.into(),
            at,
        }),
        ..obs(Some(&bound), None)
    };
    // Just refused: no pod, Running says why, an event, a look again when the back-off ends.
    let d = step(&mut dv, &refused(1, t0()), &cfg);
    assert!(!d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))));
    assert_eq!(events(&d), [(true, "CreatePodFailed".to_string())]);
    let running = cond(&d, "Running");
    assert_eq!(running.reason.as_deref(), Some("CreatePodFailed"));
    assert!(running.message.as_deref().unwrap().contains(message));
    assert_eq!(d.requeue, Some(cfg.retry.delay(1)));
    // Refused again: no new event for the same message, a longer back-off.
    let d = step(&mut dv, &refused(2, t0()), &cfg);
    assert!(events(&d).is_empty());
    assert_eq!(d.requeue, Some(cfg.retry.delay(2)));
    // Once the back-off has passed, the pod is made again.
    let late = t0() - k8s_openapi::jiff::SignedDuration::try_from(cfg.retry.delay(2)).unwrap();
    let d = step(&mut dv, &refused(2, late), &cfg);
    assert!(d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))));
}

#[test]
fn an_issued_upload_certificate_comes_before_the_upload_server_and_while_it_runs() {
    let cfg = Config {
        upload_tls: Some(UploadTls::Issued {
            namespace: "quarry".into(),
        }),
        ..Config::default()
    };
    let ensure = Action::EnsureUploadSecret {
        namespace: "quarry".into(),
    };
    let mut dv = upload_dv();
    let bound = pvc("Bound");
    let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
    let create = d
        .actions
        .iter()
        .position(|a| matches!(a, Action::CreatePod(_)))
        .expect("the upload server is made");
    assert_eq!(d.actions.iter().position(|a| *a == ensure), Some(0));
    assert!(create > 0);
    let server = created_pod(&d).clone();
    let d = step(&mut dv, &obs(Some(&bound), Some(&server)), &cfg);
    assert!(d.actions.contains(&ensure), "{:?}", d.actions);
    // An import never gets one.
    let mut import = http_dv();
    let d = step(&mut import, &obs(Some(&bound), None), &cfg);
    assert!(!d.actions.contains(&ensure));
}

use super::pvc::tests::profile;

#[test]
fn a_claim_without_access_modes_waits_for_a_profile_with_cdis_message_once() {
    let cfg = Config::default();
    let mut dv = http_dv();
    let o = Observed {
        storage: pvc::StorageDefaults::Cluster {
            class: Some("local".into()),
            profile: Some(profile(&[])),
        },
        ..obs(None, None)
    };
    let d = step(&mut dv, &o, &cfg);
    assert!(
        d.actions.iter().all(|a| matches!(a, Action::Event(_))),
        "{:?}",
        d.actions
    );
    let msg = "Spec is missing accessMode and volumeMode, cannot get access mode from StorageProfile local";
    assert_eq!(events(&d), [(true, "ErrClaimNotValid".to_string())]);
    assert_eq!(d.status.phase, Some(Phase::Pending));
    let bound = cond(&d, "Bound");
    assert_eq!(
        (bound.reason.as_deref(), bound.message.as_deref()),
        (Some("ErrClaimNotValid"), Some(msg))
    );
    assert_eq!(d.requeue, Some(cfg.retry.delay(1)));
    // The same message again: no second event.
    assert!(events(&step(&mut dv, &o, &cfg)).is_empty());
    // No StorageClass at all.
    let o = Observed {
        storage: pvc::StorageDefaults::Cluster {
            class: None,
            profile: None,
        },
        ..obs(None, None)
    };
    let d = step(&mut dv, &o, &cfg);
    assert_eq!(
        cond(&d, "Bound").message.as_deref(),
        Some(pvc::NO_CLASS_FOR_ACCESS_MODES)
    );
    // Once the profile knows the class, the PVC is created with its first set.
    let o = Observed {
        storage: pvc::StorageDefaults::Cluster {
            class: Some("local".into()),
            profile: Some(profile(&[
                ("ReadWriteMany", "Block"),
                ("ReadWriteOnce", "Filesystem"),
            ])),
        },
        ..obs(None, None)
    };
    let d = step(&mut dv, &o, &cfg);
    let Some(Action::CreatePvc(p)) = d.actions.first() else {
        panic!("{:?}", d.actions)
    };
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteMany".to_string()][..])
    );
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("local"));
}

#[test]
fn importer_pods_get_the_import_proxy_resources_pull_secrets_and_global_preallocation() {
    let cfg = Config {
        import_proxy: api::cdi::ImportProxy {
            http_proxy: Some("http://proxy:3128".into()),
            https_proxy: Some("http://proxy:3129".into()),
            no_proxy: Some(String::new()),
            trusted_ca_proxy: Some("proxy-ca".into()),
        },
        resources: Some(crate::settings::pod_resources(None)),
        image_pull_secrets: vec![k8s_openapi::api::core::v1::LocalObjectReference {
            name: "pull".into(),
        }],
        preallocation: true,
        ..Config::default()
    };
    let bound = pvc("Bound");
    let o = Observed {
        refs: SourceRefs {
            proxy_ca_keys: vec!["ca.pem".into()],
            ..SourceRefs::default()
        },
        ..obs(Some(&bound), None)
    };
    let d = decide(&http_dv(), &o, &cfg);
    let p = created_pod(&d);
    let spec = p.spec.as_ref().unwrap();
    let c = &spec.containers[0];
    let env: Vec<_> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(
        env,
        [
            ("HTTP_PROXY", "http://proxy:3128"),
            ("HTTPS_PROXY", "http://proxy:3129")
        ],
        "an empty noProxy sets no variable"
    );
    let a = args(p).join(" ");
    assert!(a.contains("--ca-cert /proxycerts/ca.pem"), "{a}");
    assert!(a.contains("--preallocate"), "{a}");
    let vol = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "cdi-proxy-cert-vol")
        .unwrap();
    assert_eq!(
        vol.config_map.as_ref().unwrap().name,
        "import-proxy-cm-fedora"
    );
    assert_eq!(c.resources, Some(default_resources()));
    assert_eq!(spec.image_pull_secrets.as_ref().unwrap()[0].name, "pull");
    // The DataVolume's own preallocation wins; blank disks get no proxy.
    let mut dv = http_dv();
    dv.spec.preallocation = Some(false);
    let a = args(created_pod(&decide(&dv, &obs(Some(&bound), None), &cfg))).join(" ");
    assert!(!a.contains("--preallocate"), "{a}");
    let blank = dv_with(DataVolumeSource {
        blank: Some(Empty {}),
        ..Default::default()
    });
    let p = created_pod(&decide(&blank, &obs(Some(&bound), None), &cfg)).clone();
    assert!(p.spec.unwrap().containers[0].env.is_none());
}

fn source_ref_dv() -> DataVolume {
    let mut dv = http_dv();
    dv.spec.source = None;
    dv.spec.source_ref = Some(api::datavolume::DataVolumeSourceRef {
        kind: "DataSource".into(),
        namespace: Some("golden".into()),
        name: "fedora".into(),
    });
    dv
}

#[test]
fn a_source_ref_waits_pending_with_cdis_reason_while_its_data_source_is_not_ready() {
    let cfg = Config::default();
    let mut dv = source_ref_dv();
    let waiting = Observed {
        source_ref: Some(clone::SourceRef::Wait {
            reason: clone::reason::CLONE_WITHOUT_SOURCE,
            message: "The source datasource golden/fedora doesn't exist".into(),
        }),
        ..obs(None, None)
    };
    let d = step(&mut dv, &waiting, &cfg);
    assert_eq!(d.status.phase, Some(Phase::Pending));
    assert!(d.actions.iter().all(|a| matches!(a, Action::Event(_))));
    assert_eq!(events(&d), [(true, "CloneWithoutSource".to_string())]);
    let bound = cond(&d, condition::BOUND);
    assert_eq!(
        (bound.status.as_str(), bound.reason.as_deref()),
        ("False", Some("CloneWithoutSource"))
    );
    assert_eq!(
        bound.message.as_deref(),
        Some("The source datasource golden/fedora doesn't exist")
    );
    assert_eq!(
        cond(&d, condition::READY).reason.as_deref(),
        Some("CloneWithoutSource")
    );
    assert_eq!(d.requeue, Some(cfg.retry.delay(1)));
    // The same wait again: no second event.
    let d = step(&mut dv, &waiting, &cfg);
    assert!(events(&d).is_empty());
}

#[test]
fn a_resolved_source_ref_is_the_data_sources_clone_source() {
    // The resolved PVC is cloned: without the source PVC observed, the clone waits for it.
    let resolved = Observed {
        source_ref: Some(clone::SourceRef::Pvc(api::datavolume::SourcePvc {
            namespace: "golden".into(),
            name: "fedora-3d8e5b5ff4b1".into(),
        })),
        ..obs(None, None)
    };
    // The token covers the resolved source: none, and the clone goes no further.
    let mut unsigned = source_ref_dv();
    let d = step(&mut unsigned, &resolved, &Config::default());
    assert_eq!(
        cond(&d, condition::BOUND).reason.as_deref(),
        Some(super::clone::token::CLONE_VALIDATION_FAILED)
    );
    let mut dv = source_ref_dv();
    let source = ("golden", "fedora-3d8e5b5ff4b1");
    super::clone::token::testing::sign_for(&mut dv, super::source::CloneSourceKind::Pvc, source);
    let d = step(&mut dv, &resolved, &super::clone::token::testing::config());
    assert_eq!(d.status.phase, Some(Phase::Pending));
    assert_eq!(
        cond(&d, condition::BOUND).message.as_deref(),
        Some("The source pvc golden/fedora-3d8e5b5ff4b1 doesn't exist")
    );
    // Without a lookup (local mode) the sourceRef itself is refused.
    let mut dv = source_ref_dv();
    let d = step(&mut dv, &obs(None, None), &Config::default());
    assert!(
        cond(&d, condition::READY)
            .message
            .as_deref()
            .unwrap()
            .contains("sourceRef")
    );
}

/// `quarry import`'s arguments as clap parses them from an importer pod's argv.
#[derive(clap::Parser)]
struct ImportCommand {
    #[command(flatten)]
    args: importer::cli::ImportArgs,
}

#[test]
fn an_archive_datavolume_extracts_into_the_volume_directory() {
    use clap::Parser;
    let cfg = Config {
        preallocation: true,
        ..Config::default()
    };
    let mut dv = http_dv();
    dv.spec.content_type = Some(api::datavolume::ContentType::Archive);
    let bound = pvc("Bound");
    let d = decide(&dv, &obs(Some(&bound), None), &cfg);
    let argv = args(created_pod(&d));
    assert_eq!(
        argv[..4],
        [
            "import",
            "https://images.example/fedora.qcow2",
            "/data",
            "--archive"
        ]
    );
    assert!(!argv.contains(&"--preallocate".to_string()), "{argv:?}");
    // The pod's argv parses back to the import the controller meant.
    let parsed = ImportCommand::try_parse_from(argv).unwrap().args;
    assert!(parsed.archive);
    assert_eq!(parsed.target, std::path::PathBuf::from("/data"));
    let Ok(super::source::Source::Import(src)) = super::source::source(&dv.spec) else {
        panic!("an http source")
    };
    let claim = pvc::claim(&dv, &cfg, &pvc::StorageDefaults::Builtin).unwrap();
    let mut expected = src.import_args("/data", &claim, &[]);
    (expected.metrics_addr, expected.owner_uid, expected.json) =
        (parsed.metrics_addr, parsed.owner_uid.clone(), true);
    assert_eq!(parsed, expected);

    let mut upload = upload_dv();
    upload.spec.content_type = dv.spec.content_type;
    let claim = pvc::claim(&upload, &cfg, &pvc::StorageDefaults::Builtin).unwrap();
    let p = pod::upload_pod(
        &pod::Workload::of(&upload),
        &claim,
        &cfg,
        "pvc-uid",
        super::source::is_archive(&upload.spec),
    );
    assert_eq!(args(&p)[0], "upload-server");
    let server: uploader::cli::ServerArgs = uploader::cli::parse_args(&args(&p)[1..]).unwrap();
    assert_eq!(server.target, std::path::PathBuf::from("/data"));
    assert!(server.archive);
    assert_eq!(server.size, Some(claim.size));
    assert!(
        !server.preallocate,
        "an archive's files are not preallocated"
    );

    let mut block = dv.clone();
    block.spec.storage.as_mut().unwrap().volume_mode = Some("Block".into());
    let e = pvc::claim(&block, &cfg, &pvc::StorageDefaults::Builtin).unwrap_err();
    assert!(e.to_string().contains("Filesystem"), "{e}");
}

#[test]
fn upload_servers_preallocate_as_the_datavolume_asks_else_as_configured() {
    let preallocates = |dv_says: Option<bool>, configured: bool| {
        let cfg = Config {
            preallocation: configured,
            ..Config::default()
        };
        let mut dv = upload_dv();
        dv.spec.preallocation = dv_says;
        let bound = pvc("Bound");
        let d = decide(&dv, &obs(Some(&bound), None), &cfg);
        let argv = args(created_pod(&d));
        assert_eq!(argv[0], "upload-server");
        // The pod's argv parses back to the server the controller meant.
        let server: uploader::cli::ServerArgs = uploader::cli::parse_args(&argv[1..]).unwrap();
        server.preallocate
    };
    assert!(preallocates(Some(true), false));
    assert!(
        preallocates(None, true),
        "the CDI CR's global preallocation"
    );
    assert!(
        !preallocates(Some(false), true),
        "the DataVolume's own wins"
    );
    assert!(!preallocates(None, false));
}

#[test]
fn an_archive_pvc_carries_cdis_content_type_annotation() {
    let mut dv = upload_dv();
    let cfg = Config::default();
    let claim = pvc::claim(&dv, &cfg, &pvc::StorageDefaults::Builtin).unwrap();
    let ann = |dv: &DataVolume| {
        pvc::desired_pvc(dv, &claim)
            .metadata
            .annotations
            .unwrap()
            .get(ANN_CONTENT_TYPE)
            .cloned()
    };
    assert_eq!(ann(&dv), None);
    dv.spec.content_type = Some(api::datavolume::ContentType::Archive);
    assert_eq!(ann(&dv).as_deref(), Some("archive"));
}

/// A PVC made for a populated DataVolume, with the populator's annotations.
fn populated_pvc(phase: &str, annotations: &[(&str, &str)]) -> PersistentVolumeClaim {
    let mut p = pvc(phase);
    p.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    p.spec = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
        data_source_ref: Some(k8s_openapi::api::core::v1::TypedObjectReference {
            api_group: Some("cdi.kubevirt.io".into()),
            kind: "VolumeImportSource".into(),
            name: format!("volume-import-source-{UID}"),
            namespace: None,
        }),
        ..Default::default()
    });
    p
}

fn on_csi<'a>(pvc: Option<&'a PersistentVolumeClaim>) -> Observed<'a> {
    Observed {
        csi_class: Some(true),
        ..obs(pvc, None)
    }
}

#[test]
fn on_a_csi_class_a_datavolume_makes_its_import_source_and_a_pvc_naming_it() {
    use crate::datavolume::populated::PopulatorSource;
    let cfg = Config::default();
    let mut dv = http_dv();
    dv.metadata.annotations = Some(BTreeMap::from([(
        ANN_IMMEDIATE_BINDING.to_string(),
        "true".to_string(),
    )]));
    dv.spec.priority_class_name = Some("vm-disks".into());
    let d = step(&mut dv, &on_csi(None), &cfg);
    let Some(Action::CreatePopulatorSource(src)) = d.actions.first() else {
        panic!("{:?}", d.actions)
    };
    let PopulatorSource::Import(meta, spec) = src.as_ref() else {
        panic!("{src:?}")
    };
    let name = format!("volume-import-source-{UID}");
    assert_eq!(meta.name.as_deref(), Some(name.as_str()));
    assert_eq!(meta.owner_references.as_ref().unwrap()[0].uid, UID);
    let http = spec.source.as_ref().unwrap().http.as_ref().unwrap();
    assert_eq!(http.url, "https://images.example/fedora.qcow2");
    assert_eq!(http.checksum.as_deref(), Some(SHA));
    assert_eq!(spec.target_claim.as_deref(), Some("fedora"));
    let Some(Action::CreatePvc(p)) = d.actions.get(1) else {
        panic!("{:?}", d.actions)
    };
    let r = p.spec.as_ref().unwrap().data_source_ref.as_ref().unwrap();
    assert_eq!(
        (r.kind.as_str(), r.name.as_str()),
        ("VolumeImportSource", name.as_str())
    );
    assert!(
        p.metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(ANN_IMMEDIATE_BINDING)
    );
    let priority = p
        .metadata
        .annotations
        .as_ref()
        .unwrap()
        .get(crate::populator::ANN_PRIORITY_CLASS);
    assert_eq!(priority.map(String::as_str), Some("vm-disks"));
    assert!(!d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))));
    assert_eq!(d.status.phase, Some(Phase::Pending));

    // usePopulator "false", or a PVC made without a source: the importer pod as before.
    let mut off = http_dv();
    off.metadata.annotations = Some(BTreeMap::from([(
        crate::datavolume::populated::ANN_USE_POPULATOR.to_string(),
        "false".to_string(),
    )]));
    let d = step(&mut off, &on_csi(None), &cfg);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::CreatePopulatorSource(_)))
    );
    let bound = pvc("Bound");
    let d = step(&mut http_dv(), &on_csi(Some(&bound)), &cfg);
    created_pod(&d);
}

#[test]
fn a_populated_datavolume_follows_the_populator_annotations_to_success() {
    use crate::populator::{ANN_POD_PHASE, ANN_PROGRESS, ANN_SELECTED_NODE};
    let cfg = Config::default();
    let mut dv = http_dv();
    // WaitForFirstConsumer, no node chosen yet: PendingPopulation.
    let waiting = populated_pvc("Pending", &[]);
    let d = step(
        &mut dv,
        &Observed {
            wait_for_first_consumer: true,
            ..on_csi(Some(&waiting))
        },
        &cfg,
    );
    assert_eq!(d.status.phase, Some(Phase::PendingPopulation));
    assert!(d.actions.is_empty(), "{:?}", d.actions);

    let chosen = populated_pvc(
        "Pending",
        &[(ANN_SELECTED_NODE, "n1"), (ANN_POD_PHASE, "Pending")],
    );
    let d = step(&mut dv, &on_csi(Some(&chosen)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::ImportScheduled));
    assert_eq!(events(&d), [(false, "ImportScheduled".to_string())]);

    let running = populated_pvc(
        "Pending",
        &[(ANN_POD_PHASE, "Running"), (ANN_PROGRESS, "42.50%")],
    );
    let d = step(&mut dv, &on_csi(Some(&running)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::ImportInProgress));
    assert_eq!(d.status.progress.as_deref(), Some("42.50%"));
    assert_eq!(cond(&d, condition::RUNNING).status, "True");

    let bound = populated_pvc(
        "Bound",
        &[(ANN_POD_PHASE, "Succeeded"), (ANN_PROGRESS, "100.0%")],
    );
    let d = step(&mut dv, &on_csi(Some(&bound)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    assert_eq!(d.status.progress.as_deref(), Some("100.00%"));
    assert_eq!(cond(&d, condition::READY).status, "True");
    assert_eq!(events(&d), [(false, "ImportSucceeded".to_string())]);
}

#[test]
fn a_populated_datavolume_fails_on_a_terminal_failure_and_counts_retries() {
    use crate::populator::{
        ANN_POD_PHASE, ANN_POD_RESTARTS, ANN_RUNNING_MESSAGE, ANN_RUNNING_REASON,
    };
    let cfg = Config::default();
    let mut dv = http_dv();
    let retrying = populated_pvc(
        "Pending",
        &[
            (ANN_POD_PHASE, "Failed"),
            (ANN_POD_RESTARTS, "2"),
            (ANN_RUNNING_REASON, "SourceUnavailable"),
            (ANN_RUNNING_MESSAGE, "import into fedora failed: 503"),
        ],
    );
    let d = step(&mut dv, &on_csi(Some(&retrying)), &cfg);
    assert_ne!(d.status.phase, Some(Phase::Failed));
    assert_eq!(d.status.restart_count, Some(2));
    assert_eq!(
        cond(&d, condition::RUNNING).reason.as_deref(),
        Some("SourceUnavailable")
    );

    let terminal = populated_pvc(
        "Pending",
        &[
            (ANN_POD_PHASE, "Failed"),
            (ANN_RUNNING_REASON, "ChecksumMismatch"),
            (ANN_RUNNING_MESSAGE, "import into fedora failed: checksum"),
        ],
    );
    let d = step(&mut dv, &on_csi(Some(&terminal)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    assert_eq!(
        cond(&d, condition::READY).reason.as_deref(),
        Some("ChecksumMismatch")
    );
    assert_eq!(events(&d), [(true, "ImportFailed".to_string())]);
}

/// `dv` with one more annotation.
fn annotated(mut dv: DataVolume, key: &str, value: &str) -> DataVolume {
    dv.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_string(), value.to_string());
    dv
}

/// The PVC of `fedora` as the user prepared it: annotated `populatedFor: for_dv`, with a
/// resourceVersion and an owner of its own.
fn prepared_pvc(phase: &str, for_dv: &str) -> PersistentVolumeClaim {
    let mut p = pvc(phase);
    p.metadata.name = Some("fedora".into());
    p.metadata.resource_version = Some("42".into());
    p.metadata.annotations = Some(BTreeMap::from([(
        adopt::ANN_POPULATED_FOR.to_string(),
        for_dv.to_string(),
    )]));
    p.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "keeper".into(),
            uid: "keeper-uid".into(),
            ..Default::default()
        },
    ]);
    p
}

/// Owner references as (kind, controller).
type Owners<'a> = Vec<(&'a str, Option<bool>)>;

/// The owners an AdoptPvc action writes, with the resourceVersion guarding them.
fn adoption(d: &Decision) -> Option<(Option<&str>, Owners<'_>)> {
    d.actions.iter().find_map(|a| match a {
        Action::AdoptPvc {
            resource_version,
            owners,
        } => Some((
            resource_version.as_deref(),
            owners
                .iter()
                .map(|o| (o.kind.as_str(), o.controller))
                .collect(),
        )),
        _ => None,
    })
}

#[test]
fn a_pvc_populated_for_the_datavolume_is_adopted_succeeded_without_any_pod() {
    let cfg = Config::default();
    let bound = prepared_pvc("Bound", "fedora");
    let clone_dv = dv_with(DataVolumeSource {
        pvc: Some(api::datavolume::SourcePvc {
            namespace: "golden".into(),
            name: "fedora".into(),
        }),
        ..Default::default()
    });
    let blank = annotated(
        dv_with(DataVolumeSource {
            blank: Some(Empty {}),
            ..Default::default()
        }),
        crate::datavolume::populated::ANN_USE_POPULATOR,
        "true",
    );
    // Every kind of source, even one Quarry would refuse, and on a CSI class (populators).
    let mut vddk = http_dv();
    vddk.spec.source.as_mut().unwrap().vddk = Some(Default::default());
    for (what, mut dv) in [
        ("http", http_dv()),
        ("upload", upload_dv()),
        ("clone", clone_dv),
        ("sourceRef", source_ref_dv()),
        ("blank with populators", blank),
        ("vddk", vddk),
    ] {
        let d = step(&mut dv, &on_csi(Some(&bound)), &cfg);
        assert_eq!(d.status.phase, Some(Phase::Succeeded), "{what}");
        assert_eq!(
            adoption(&d),
            Some((
                Some("42"),
                vec![("ConfigMap", None), ("DataVolume", Some(true))]
            )),
            "{what}: {:?}",
            d.actions
        );
        assert_eq!(d.actions.len(), 1, "{what}: {:?}", d.actions);
        assert_eq!(cond(&d, condition::READY).status, "True", "{what}");
        let b = cond(&d, condition::BOUND);
        assert_eq!(
            (b.status.as_str(), b.reason.as_deref(), b.message.as_deref()),
            ("True", Some("Bound"), Some("PVC fedora Bound")),
            "{what}"
        );
        assert_eq!(cond(&d, condition::RUNNING).status, "False", "{what}");
        assert_eq!(d.status.progress.as_deref(), Some("N/A"), "{what}");
        assert_eq!(d.status.claim_name.as_deref(), Some("fedora"), "{what}");
        // Succeeded is final: the next look does nothing either.
        let again = step(&mut dv, &obs(Some(&bound), None), &cfg);
        assert!(again.actions.is_empty(), "{what}: {:?}", again.actions);
    }
}

#[test]
fn an_adopted_pvc_keeps_its_owners_when_retained_owned_or_controlled_elsewhere() {
    let cfg = Config::default();
    // Retained: no owner added, as for the PVCs the DataVolume makes.
    let mut kept = annotated(http_dv(), ANN_RETAIN_PVC, "true");
    let d = step(
        &mut kept,
        &obs(Some(&prepared_pvc("Bound", "fedora")), None),
        &cfg,
    );
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    // Already the DataVolume's: nothing to write.
    let mut dv = http_dv();
    let mut owned = prepared_pvc("Bound", "fedora");
    owned.metadata.owner_references = owner_ref(&dv).map(|o| vec![o]);
    let d = step(&mut dv, &obs(Some(&owned), None), &cfg);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    // Another controller already: the DataVolume is added as a plain owner.
    let mut dv = http_dv();
    let mut controlled = prepared_pvc("Bound", "fedora");
    controlled.metadata.owner_references.as_mut().unwrap()[0].controller = Some(true);
    let d = step(&mut dv, &obs(Some(&controlled), None), &cfg);
    assert_eq!(
        adoption(&d).map(|(_, o)| o),
        Some(vec![("ConfigMap", Some(true)), ("DataVolume", Some(false))])
    );
}

#[test]
fn a_pending_populated_pvc_is_adopted_a_lost_one_fails_and_one_for_another_is_imported_into() {
    let cfg = Config::default();
    // Pending (CDI: no work required, Succeeded whatever the binding).
    let mut dv = http_dv();
    let pending = prepared_pvc("Pending", "fedora");
    let d = step(&mut dv, &obs(Some(&pending), None), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    let b = cond(&d, condition::BOUND);
    assert_eq!(
        (b.status.as_str(), b.message.as_deref()),
        ("False", Some("PVC fedora Pending"))
    );
    // Lost: CDI's ClaimLost failure, nothing adopted.
    let mut dv = http_dv();
    let d = step(
        &mut dv,
        &obs(Some(&prepared_pvc("Lost", "fedora")), None),
        &cfg,
    );
    assert_eq!(d.status.phase, Some(Phase::Failed));
    assert_eq!(events(&d), [(true, "ErrClaimLost".to_string())]);
    assert_eq!(adoption(&d), None);
    // Being deleted: nothing adopted, nothing started.
    let mut dv = http_dv();
    let mut going = prepared_pvc("Bound", "fedora");
    going.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t0()));
    let d = step(&mut dv, &obs(Some(&going), None), &cfg);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_ne!(d.status.phase, Some(Phase::Succeeded));
    // Populated for another DataVolume: this one's own flow (its importer) goes on.
    let mut dv = http_dv();
    let d = step(
        &mut dv,
        &obs(Some(&prepared_pvc("Bound", "other")), None),
        &cfg,
    );
    assert_eq!(args(created_pod(&d))[0], "import");
}

#[test]
fn adoption_mid_import_stops_the_running_importer() {
    let cfg = Config::default();
    let mut dv = http_dv();
    let plain = pvc("Bound");
    step(&mut dv, &obs(Some(&plain), None), &cfg);
    let running = pod_in("Running");
    let d = step(&mut dv, &obs(Some(&plain), Some(&running)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::ImportInProgress));
    let d = step(
        &mut dv,
        &obs(Some(&prepared_pvc("Bound", "fedora")), Some(&running)),
        &cfg,
    );
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    assert!(
        d.actions
            .contains(&Action::DeletePod("importer-fedora".into())),
        "{:?}",
        d.actions
    );
}

#[test]
fn a_pre_populated_datavolume_makes_no_pvc_and_waits_for_the_one_populated_for_it() {
    let cfg = Config::default();
    let mut dv = annotated(http_dv(), adopt::ANN_PRE_POPULATED, "fedora");
    let d = step(&mut dv, &on_csi(None), &cfg);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.status.phase, Some(Phase::Pending));
    let b = cond(&d, condition::BOUND);
    assert_eq!(b.reason.as_deref(), Some("Pending"));
    assert!(
        b.message
            .as_deref()
            .unwrap()
            .contains("storage.prePopulated and waits for its PVC"),
        "{b:?}"
    );
    // A PVC not populated for it is left alone: no importer.
    let plain = pvc("Bound");
    let d = step(&mut dv, &obs(Some(&plain), None), &cfg);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.status.phase, Some(Phase::PvcBound));
    assert!(
        cond(&d, condition::BOUND)
            .message
            .as_deref()
            .unwrap()
            .contains("nothing is written to it")
    );
    // The populated one is adopted.
    let d = step(
        &mut dv,
        &obs(Some(&prepared_pvc("Bound", "fedora")), None),
        &cfg,
    );
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    assert!(adoption(&d).is_some());
}

/// CDI's external population: no source, a claim naming a populator. The PVC carries it (and
/// CDI's marker), nothing runs, the DataVolume waits for the binding and then is Succeeded; a
/// populator other than a snapshot on storage without a CSI driver stops at PVCBound, saying so.
#[test]
fn an_external_populator_fills_the_pvc_and_the_datavolume_follows_its_binding() {
    let cfg = Config::default();
    let mut dv = DataVolume::new(
        "fedora",
        DataVolumeSpec {
            storage: Some(StorageSpec {
                data_source_ref: Some(k8s_openapi::api::core::v1::TypedObjectReference {
                    api_group: Some("cdi.kubevirt.io".into()),
                    kind: "VolumeImportSource".into(),
                    name: "fedora-source".into(),
                    namespace: None,
                }),
                ..storage("1Gi").unwrap()
            }),
            ..Default::default()
        },
    );
    dv.metadata.namespace = Some("vms".into());
    dv.metadata.uid = Some(UID.into());
    assert_eq!(validate(&dv, &cfg), Ok(()));

    let d = step(&mut dv, &obs(None, None), &cfg);
    let [Action::CreatePvc(p)] = &d.actions[..] else {
        panic!("{:?}", d.actions)
    };
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.data_source_ref.as_ref().unwrap().name, "fedora-source");
    let ann = p.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann[external::ANN_EXTERNAL_POPULATION], "true");
    assert_eq!(d.status.phase, Some(Phase::Pending));

    // Pending while the populator works: no pod of Quarry's, even where the importer would be
    // a WaitForFirstConsumer PVC's first consumer.
    let pending = pvc("Pending");
    let waiting = Observed {
        wait_for_first_consumer: true,
        ..obs(Some(&pending), None)
    };
    let d = step(&mut dv, &waiting, &cfg);
    assert!(
        !d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))),
        "{d:?}"
    );
    assert_eq!(d.status.phase, Some(Phase::WaitForFirstConsumer));

    // Bound on CSI storage: Succeeded, with CDI's event.
    let bound = pvc("Bound");
    let csi = Observed {
        csi_class: Some(true),
        ..obs(Some(&bound), None)
    };
    let d = step(&mut dv.clone(), &csi, &cfg);
    assert_eq!(d.status.phase, Some(Phase::Succeeded));
    assert_eq!(d.status.progress.as_deref(), Some("100.00%"));
    assert_eq!(
        events(&d),
        [(false, "ExternalPopulationSucceeded".to_string())]
    );

    // Not a CSI driver's class: CDI's refusal.
    let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
    assert_eq!(d.status.phase, Some(Phase::PvcBound));
    assert_eq!(
        events(&d),
        [(true, "NoCSIDriverForExternalPopulation".to_string())]
    );
}

/// CDI passes a DataVolume's pod networks and sidecar switches to its PVC and its pods, and
/// nothing else; sidecars are off unless asked.
#[test]
fn pod_networks_and_sidecar_switches_reach_the_pvc_and_the_pods() {
    let cfg = Config::default();
    let mut dv = http_dv();
    let d = step(&mut dv.clone(), &obs(None, None), &cfg);
    let [Action::CreatePvc(plain)] = &d.actions[..] else {
        panic!("{:?}", d.actions)
    };
    assert!(
        !plain
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key("linkerd.io/inject")
    );
    let bound = pvc("Bound");
    let d = step(&mut dv.clone(), &obs(Some(&bound), None), &cfg);
    let ann = created_pod(&d).metadata.annotations.clone().unwrap();
    assert_eq!(ann["sidecar.istio.io/inject"], "false");
    assert_eq!(ann["linkerd.io/inject"], "disabled");

    dv.metadata.annotations = Some(BTreeMap::from([
        (
            "k8s.v1.cni.cncf.io/networks".to_string(),
            "net1".to_string(),
        ),
        ("linkerd.io/inject".to_string(), "enabled".to_string()),
        ("annot1".to_string(), "value1".to_string()),
    ]));
    let d = step(&mut dv.clone(), &obs(None, None), &cfg);
    let [Action::CreatePvc(p)] = &d.actions[..] else {
        panic!("{:?}", d.actions)
    };
    let ann = p.metadata.annotations.clone().unwrap();
    assert_eq!(ann["k8s.v1.cni.cncf.io/networks"], "net1");
    assert!(!ann.contains_key("annot1"));
    let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
    let ann = created_pod(&d).metadata.annotations.clone().unwrap();
    assert_eq!(ann["k8s.v1.cni.cncf.io/networks"], "net1");
    assert_eq!(ann["linkerd.io/inject"], "enabled");
    assert_eq!(ann["sidecar.istio.io/inject"], "false");
    assert!(!ann.contains_key("annot1"));
}

/// The CDI CR's `spec.workload` places every pod (CDI's workload node placement).
#[test]
fn the_workload_placement_reaches_the_pods() {
    let placement: api::hostpath::NodePlacement = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"disktype": "ssd"},
        "tolerations": [{"key": "storage", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
    }))
    .unwrap();
    let cfg = Config {
        workload: placement.clone(),
        ..Config::default()
    };
    let bound = pvc("Bound");
    for mut dv in [http_dv(), upload_dv()] {
        let d = step(&mut dv, &obs(Some(&bound), None), &cfg);
        let spec = created_pod(&d).spec.clone().unwrap();
        assert_eq!(spec.node_selector, Some(placement.node_selector.clone()));
        assert_eq!(spec.tolerations, Some(placement.tolerations.clone()));
        assert_eq!(spec.affinity, placement.affinity);
    }
    // Without one, the scheduler's defaults.
    let mut dv = http_dv();
    let d = step(&mut dv, &obs(Some(&bound), None), &Config::default());
    let spec = created_pod(&d).spec.clone().unwrap();
    assert_eq!(
        (spec.node_selector, spec.tolerations, spec.affinity),
        (None, None, None)
    );
}

/// The kubelet reports a container's end a status sync before the pod's phase: a pod that
/// never restarts whose container exited is taken as over at once, as its phase will say.
#[test]
fn a_pod_is_over_when_its_container_exited_before_the_phase_says_so() {
    let never = |code: i32| {
        let mut p = exited(code, "");
        p.status.as_mut().unwrap().phase = Some("Running".into());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            restart_policy: Some("Never".into()),
            ..Default::default()
        });
        p
    };
    assert_eq!(decide::pod_phase(&never(0)), "Succeeded");
    assert_eq!(decide::pod_phase(&never(1)), "Failed");
    // Ended within one relist of the kubelet: never reported Running.
    let mut quick = never(0);
    quick.status.as_mut().unwrap().phase = Some("Pending".into());
    assert_eq!(decide::pod_phase(&quick), "Succeeded");
    // Still running, or a pod that may restart: the phase as reported.
    assert_eq!(decide::pod_phase(&pod_in("Running")), "Running");
    let mut restarts = never(0);
    restarts.spec.as_mut().unwrap().restart_policy = Some("OnFailure".into());
    assert_eq!(decide::pod_phase(&restarts), "Running");

    let cfg = Config::default();
    let mut dv = http_dv();
    let bound = pvc("Bound");
    let done = never(0);
    let d = step(&mut dv, &obs(Some(&bound), Some(&done)), &cfg);
    assert_eq!(d.status.phase, Some(Phase::Succeeded), "{d:?}");
}
