//! CDI's conditions, reasons and progress format for DataVolumes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use api::datavolume::DataVolumeCondition;

/// Event and condition reasons, CDI's spelling.
pub mod reason {
    /// Event: the importer pod was created.
    pub const IMPORT_SCHEDULED: &str = "ImportScheduled";
    /// Event: the importer pod runs.
    pub const IMPORT_IN_PROGRESS: &str = "ImportInProgress";
    /// Event: the import finished.
    pub const IMPORT_SUCCEEDED: &str = "ImportSucceeded";
    /// Event: an import attempt failed.
    pub const IMPORT_FAILED: &str = "ImportFailed";
    /// Event: the upload server pod was created.
    pub const UPLOAD_SCHEDULED: &str = "UploadScheduled";
    /// Event: the upload server accepts data.
    pub const UPLOAD_READY: &str = "UploadReady";
    /// Event: the upload finished.
    pub const UPLOAD_SUCCEEDED: &str = "UploadSucceeded";
    /// Event: the upload server failed.
    pub const UPLOAD_FAILED: &str = "UploadFailed";
    /// Event and Running: the API server refused the pod (Pod Security, quota, a webhook).
    pub const CREATE_POD_FAILED: &str = "CreatePodFailed";
    /// Event: a failed attempt is retried after a back-off.
    pub const IMPORT_RETRYING: &str = "ImportRetrying";
    /// Event: a failed upload server is restarted after a back-off.
    pub const UPLOAD_RETRYING: &str = "UploadRetrying";
    /// Event: the DataVolume cannot be acted on.
    pub const DATA_VOLUME_FAILED: &str = "DataVolumeFailed";
    /// Event: the PVC lost its volume.
    pub const ERR_CLAIM_LOST: &str = "ErrClaimLost";
    /// Condition: the spec is invalid.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The claim cannot be completed yet: no StorageClass or StorageProfile gives its access
    /// modes (CDI's event reason).
    pub const ERR_CLAIM_NOT_VALID: &str = "ErrClaimNotValid";
    /// Ready while the transfer runs.
    pub const TRANSFER_RUNNING: &str = "TransferRunning";
    /// Bound: the PVC is bound.
    pub const BOUND: &str = "Bound";
    /// Bound: the PVC is pending.
    pub const PENDING: &str = "Pending";
    /// Bound: the PVC lost its volume.
    pub const CLAIM_LOST: &str = "ClaimLost";
    /// Running: the pod runs.
    pub const POD_RUNNING: &str = "Pod is running";
    /// Running: the pod finished successfully.
    pub const COMPLETED: &str = "Completed";
    /// Running: the volume waits for its first consumer.
    pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";
}

/// Sets a condition as CDI does: the transition time moves only when the status changes, the
/// heartbeat whenever reason or message change.
pub fn set_condition(
    conditions: &mut Vec<DataVolumeCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" };
    let idx = match conditions.iter().position(|c| c.type_ == type_) {
        Some(i) => i,
        None => {
            conditions.push(DataVolumeCondition {
                type_: type_.into(),
                ..Default::default()
            });
            conditions.len() - 1
        }
    };
    let c = &mut conditions[idx];
    let reason = (!reason.is_empty()).then(|| reason.to_string());
    let message = (!message.is_empty()).then(|| message.to_string());
    if c.status != status {
        c.last_transition_time = Some(Time(now));
        c.last_heartbeat_time = Some(Time(now));
    } else if c.reason != reason || c.message != message {
        c.last_heartbeat_time = Some(Time(now));
    }
    c.status = status.into();
    c.reason = reason;
    c.message = message;
}

/// The condition of a type.
pub fn find<'a>(
    conditions: &'a [DataVolumeCondition],
    type_: &str,
) -> Option<&'a DataVolumeCondition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `status.progress` as CDI writes it: two decimals and a percent sign.
pub fn format_progress(percent: f64) -> String {
    format!("{:.2}%", percent.clamp(0.0, 100.0))
}

/// Progress when it is not known.
pub const PROGRESS_UNKNOWN: &str = "N/A";

/// The importer's progress counter.
pub const IMPORT_PROGRESS: &str = "kubevirt_cdi_import_progress_total";
/// The clone source's progress counter (CDI's cloner's, served by `quarry clone-source`).
pub const CLONE_PROGRESS: &str = "kubevirt_cdi_clone_progress_total";

/// The importer's progress from its Prometheus text: the
/// `kubevirt_cdi_import_progress_total{ownerUID="UID"}` sample (as CDI's controller reads it).
pub fn parse_progress(metrics: &str, owner_uid: &str) -> Option<f64> {
    parse_counter(metrics, IMPORT_PROGRESS, owner_uid)
}

/// The `metric{ownerUID="UID"}` sample of a Prometheus text.
pub fn parse_counter(metrics: &str, metric: &str, owner_uid: &str) -> Option<f64> {
    let label = format!("ownerUID=\"{owner_uid}\"");
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?;
        let (labels, value) = rest.strip_prefix('{')?.split_once('}')?;
        if !labels.split(',').any(|l| l.trim() == label) {
            return None;
        }
        value.split_whitespace().next()?.parse::<f64>().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::datavolume::condition;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut c = Vec::new();
        set_condition(&mut c, condition::RUNNING, false, "Pending", "", t(1));
        set_condition(
            &mut c,
            condition::RUNNING,
            false,
            "ContainerCreating",
            "",
            t(2),
        );
        let r = find(&c, "Running").unwrap();
        assert_eq!(r.last_transition_time, Some(Time(t(1))));
        assert_eq!(r.last_heartbeat_time, Some(Time(t(2))));
        set_condition(
            &mut c,
            condition::RUNNING,
            true,
            reason::POD_RUNNING,
            "",
            t(3),
        );
        let r = find(&c, "Running").unwrap();
        assert_eq!(
            (r.status.as_str(), r.last_transition_time.clone()),
            ("True", Some(Time(t(3))))
        );
        set_condition(
            &mut c,
            condition::RUNNING,
            true,
            reason::POD_RUNNING,
            "",
            t(4),
        );
        assert_eq!(
            find(&c, "Running").unwrap().last_heartbeat_time,
            Some(Time(t(3)))
        );
    }

    #[test]
    fn progress_is_formatted_like_cdi() {
        assert_eq!(format_progress(45.5), "45.50%");
        assert_eq!(format_progress(100.0), "100.00%");
        assert_eq!(format_progress(-3.0), "0.00%");
    }

    #[test]
    fn progress_is_read_for_the_owner_only() {
        let text = importer::progress::render_metrics("uid-1", &Default::default());
        assert!(parse_progress(&text, "uid-1").is_some(), "{text}");
        assert_eq!(parse_progress(&text, "uid-2"), None);
        let text = "# HELP x\nkubevirt_cdi_import_progress_total{ownerUID=\"a\"} 12.5\n\
                    kubevirt_cdi_import_progress_total{ownerUID=\"b\"} 99\n";
        assert_eq!(parse_progress(text, "a"), Some(12.5));
        assert_eq!(parse_progress(text, "b"), Some(99.0));
        assert_eq!(parse_progress("garbage", "a"), None);
    }
}
