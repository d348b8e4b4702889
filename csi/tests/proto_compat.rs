//! Checks `csi/proto/csi.proto` against the CSI spec's own `csi.proto` (v1.12.0) when it is
//! available at `../shared/csi/csi.proto` next to the repository: every message, field (name,
//! number, type, label), enum value and rpc of the project's file must be the spec's.
//! Skips (printing why) when the spec file is absent.

use std::collections::HashMap;
use std::path::PathBuf;

use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

fn collect_messages(
    prefix: &str,
    msgs: &[DescriptorProto],
    out: &mut HashMap<String, DescriptorProto>,
    enums: &mut HashMap<String, EnumDescriptorProto>,
) {
    for m in msgs {
        let name = format!("{prefix}.{}", m.name());
        for e in &m.enum_type {
            enums.insert(format!("{name}.{}", e.name()), e.clone());
        }
        collect_messages(&name, &m.nested_type, out, enums);
        out.insert(name, m.clone());
    }
}

type Index = (
    HashMap<String, DescriptorProto>,
    HashMap<String, EnumDescriptorProto>,
    HashMap<String, Vec<(String, String, String)>>,
);

fn index(set: &FileDescriptorSet) -> Index {
    let file = set
        .file
        .iter()
        .find(|f| f.name() == "csi.proto")
        .expect("csi.proto in the set");
    let prefix = format!(".{}", file.package());
    let (mut msgs, mut enums) = (HashMap::new(), HashMap::new());
    collect_messages(&prefix, &file.message_type, &mut msgs, &mut enums);
    for e in &file.enum_type {
        enums.insert(format!("{prefix}.{}", e.name()), e.clone());
    }
    let services = file
        .service
        .iter()
        .map(|s| {
            let methods = s
                .method
                .iter()
                .map(|m| {
                    (
                        m.name().to_string(),
                        m.input_type().to_string(),
                        m.output_type().to_string(),
                    )
                })
                .collect();
            (s.name().to_string(), methods)
        })
        .collect();
    (msgs, enums, services)
}

#[test]
fn project_proto_matches_the_spec() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let spec = manifest.join("../../shared/csi/csi.proto");
    if !spec.exists() {
        eprintln!(
            "SKIP: the CSI spec's csi.proto is not at {} (only the project's own proto is built)",
            spec.display()
        );
        return;
    }
    let spec_dir = spec.parent().unwrap();
    let theirs = protox::compile(["csi.proto"], [spec_dir]).expect("spec csi.proto parses");
    let ours = protox::compile(["csi.proto"], [manifest.join("proto")]).expect("our proto parses");
    let (their_msgs, their_enums, their_svcs) = index(&theirs);
    let (our_msgs, our_enums, our_svcs) = index(&ours);
    assert!(our_msgs.len() > 60, "only {} messages", our_msgs.len());

    let mut problems = Vec::new();
    for (name, m) in &our_msgs {
        let Some(t) = their_msgs.get(name) else {
            problems.push(format!("message {name} is not in the spec"));
            continue;
        };
        for f in &m.field {
            match t.field.iter().find(|tf| tf.number() == f.number()) {
                None => problems.push(format!(
                    "{name}.{} (#{}) not in the spec",
                    f.name(),
                    f.number()
                )),
                Some(tf) => {
                    if tf.name() != f.name()
                        || tf.r#type() != f.r#type()
                        || tf.label() != f.label()
                        || tf.type_name() != f.type_name()
                        || tf.oneof_index.is_some() != f.oneof_index.is_some()
                    {
                        problems.push(format!(
                            "{name} field #{}: ours {} {:?} {:?} {}, spec {} {:?} {:?} {}",
                            f.number(),
                            f.name(),
                            f.r#type(),
                            f.label(),
                            f.type_name(),
                            tf.name(),
                            tf.r#type(),
                            tf.label(),
                            tf.type_name()
                        ));
                    }
                }
            }
        }
        for tf in &t.field {
            if !m.field.iter().any(|f| f.number() == tf.number()) {
                problems.push(format!(
                    "{name}.{} (#{}) is missing",
                    tf.name(),
                    tf.number()
                ));
            }
        }
    }
    for (name, e) in &our_enums {
        let Some(t) = their_enums.get(name) else {
            problems.push(format!("enum {name} is not in the spec"));
            continue;
        };
        let ov: Vec<_> = e.value.iter().map(|v| (v.name(), v.number())).collect();
        let tv: Vec<_> = t.value.iter().map(|v| (v.name(), v.number())).collect();
        if ov != tv {
            problems.push(format!("enum {name}: ours {ov:?}, spec {tv:?}"));
        }
    }
    for svc in ["Identity", "Controller", "Node"] {
        let o = our_svcs.get(svc).expect("service in our proto");
        let t = their_svcs.get(svc).expect("service in the spec");
        if o != t {
            problems.push(format!("service {svc}: ours {o:?}, spec {t:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "differences from the spec:\n{}",
        problems.join("\n")
    );
    eprintln!(
        "checked {} messages, {} enums and 3 services against {}",
        our_msgs.len(),
        our_enums.len(),
        spec.display()
    );
}
