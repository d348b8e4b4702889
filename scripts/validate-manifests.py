#!/usr/bin/env python3
"""Validates every manifest under a directory offline and strictly (an unknown field fails).

Kubernetes' own kinds are checked against the OpenAPI schemas of a Kubernetes release shipped by
PyPI's kubernetes-validate; custom resources against the openAPIV3Schema of the CRDs found in the
same directory, with unknown fields refused wherever the schema does not preserve them (what the
API server prunes, or refuses under fieldValidation=Strict).

Usage: validate-manifests.py KUBERNETES_VERSION DIR
Prints one line per failure and exits 1 when any document fails.
"""

import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml


def strict(schema):
    """The CRD schema as JSON Schema refusing properties it does not declare."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schemas(docs):
    """(apiVersion, kind) -> JSON Schema, from the CRDs among docs."""
    out = {}
    for _, doc in docs:
        if doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for v in spec["versions"]:
            schema = strict(v["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            for field in ("apiVersion", "kind"):
                props.setdefault(field, {"type": "string"})
            props.setdefault("metadata", {"type": "object"})
            out[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = schema
    return out


def main():
    version, root = sys.argv[1], pathlib.Path(sys.argv[2])
    docs = []
    for path in sorted(root.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path, doc))
    custom = crd_schemas(docs)
    failures = 0
    for path, doc in docs:
        what = f"{path}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        key = (doc.get("apiVersion"), doc.get("kind"))
        try:
            if key in custom:
                jsonschema.validate(doc, custom[key])
            else:
                kubernetes_validate.validate(doc, version, strict=True)
        except jsonschema.ValidationError as e:
            failures += 1
            path_in_doc = "/".join(str(p) for p in e.absolute_path)
            print(f"FAIL {what}: {path_in_doc}: {e.message}")
        except kubernetes_validate.ValidationError as e:
            failures += 1
            print(f"FAIL {what}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            failures += 1
            print(f"FAIL {what}: no schema for {key} in Kubernetes {version} or the CRDs")
    print(f"{len(docs) - failures} of {len(docs)} documents valid against Kubernetes {version}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
