"""Offline, strict validation of Kubernetes objects (tests/k8s; docs/kubernetes.md, "Tests").

Core objects (v1, apps/v1, batch/v1, rbac, networking, policy, ...) are checked against the
models of Debian's python3-kubernetes (22.6: the Kubernetes 1.22 API), which carry every field's
name and type: an unknown field (a typo), a value of the wrong type or a missing required field
is an error naming the object and the path. Fields added to Kubernetes after 1.22 that the
manifests use are listed in NEWER_FIELDS with their version, and checked here.

Custom resources (ServiceMonitor, JobSet, PyTorchJob, TrainJob, TrainingRuntime, cert-manager,
ValidatingAdmissionPolicy — the last is core but newer than 1.22) are checked against the small
schemas in crd_schemas.py, written for the fields Pacer's manifests use; a pod or job template
inside one is handed back to the models, so a typo there fails the same way.

Usage: k8s_validate.py FILE... (multi-document YAML; '-' reads stdin). Exit 0 when every object
is valid, 1 with one line per error otherwise.
"""
import datetime
import re
import sys

import yaml

try:
    import kubernetes.client.models as models
except ImportError:  # pragma: no cover - reported by the caller
    models = None

import crd_schemas

# (model class, JSON field) -> (type string as the models write it, Kubernetes version).
NEWER_FIELDS = {
    ("V1Container", "restartPolicy"): ("str", "1.28: native sidecar (init container restartPolicy: Always)"),
}
# Values the newer fields may take.
NEWER_VALUES = {("V1Container", "restartPolicy"): {"Always"}}

# Kinds without a namespace: a metadata.namespace on one is an error (kustomize's namespace
# transformer adds one to kinds it does not know).
CLUSTER_SCOPED = {
    "Namespace", "Node", "PersistentVolume", "StorageClass", "ClusterRole", "ClusterRoleBinding",
    "CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "PriorityClass",
    "ClusterIssuer", "ClusterTrainingRuntime", "IngressClass", "RuntimeClass",
}

_LIST = re.compile(r"^list\[(.*)\]$")
_DICT = re.compile(r"^dict\(([^,]*), (.*)\)$")


class Errors:
    def __init__(self):
        self.items = []

    def add(self, where, msg):
        self.items.append(f"{where}: {msg}")


def model_class(api_version, kind):
    """The python3-kubernetes model for apiVersion/kind, or None."""
    if models is None:
        return None
    version = api_version.split("/")[-1]
    name = version[0].upper() + version[1:] + kind
    return getattr(models, name, None)


def _json_to_attr(cls):
    return {json: attr for attr, json in cls.attribute_map.items()}


def check_value(type_str, value, path, errors):
    """Checks `value` against a model type string ('str', 'list[V1Container]', ...)."""
    if value is None:
        return
    m = _LIST.match(type_str)
    if m:
        if not isinstance(value, list):
            errors.add(path, f"expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_value(m.group(1), v, f"{path}[{i}]", errors)
        return
    m = _DICT.match(type_str)
    if m:
        if not isinstance(value, dict):
            errors.add(path, f"expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                errors.add(path, f"map key {k!r} is not a string")
            check_value(m.group(2), v, f"{path}.{k}", errors)
        return
    if type_str == "str":
        if not isinstance(value, str):
            errors.add(path, f"expected a string, got {type(value).__name__} {value!r}")
    elif type_str == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            errors.add(path, f"expected an integer, got {type(value).__name__} {value!r}")
    elif type_str == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.add(path, f"expected a number, got {type(value).__name__} {value!r}")
    elif type_str == "bool":
        if not isinstance(value, bool):
            errors.add(path, f"expected true/false, got {type(value).__name__} {value!r}")
    elif type_str == "datetime":
        if not isinstance(value, (str, datetime.datetime)):
            errors.add(path, f"expected a timestamp, got {value!r}")
    elif type_str == "object":  # IntOrString, RawExtension, Quantity: any scalar or map
        pass
    else:
        cls = getattr(models, type_str, None)
        if cls is None:
            errors.add(path, f"internal: unknown model type {type_str}")
            return
        check_model(cls, value, path, errors)


def check_model(cls, obj, path, errors):
    """Checks a JSON object against a model class: known fields, types, required fields."""
    if not isinstance(obj, dict):
        errors.add(path, f"expected an object ({cls.__name__}), got {type(obj).__name__} {obj!r}")
        return
    by_json = _json_to_attr(cls)
    kwargs = {}
    for key, value in obj.items():
        newer = NEWER_FIELDS.get((cls.__name__, key))
        if key not in by_json and newer is None:
            known = ", ".join(sorted(by_json))
            errors.add(f"{path}.{key}", f"unknown field '{key}' in {cls.__name__} (known: {known})")
            continue
        if newer is not None:
            check_value(newer[0], value, f"{path}.{key}", errors)
            allowed = NEWER_VALUES.get((cls.__name__, key))
            if allowed is not None and value not in allowed:
                errors.add(f"{path}.{key}", f"must be one of {sorted(allowed)}, not {value!r}")
            continue
        attr = by_json[key]
        check_value(cls.openapi_types[attr], value, f"{path}.{key}", errors)
        kwargs[attr] = value
    # Required fields and enum checks live in the constructors' setters; build with the raw
    # values (nested models stay dicts, which the setters accept) and report what they refuse.
    try:
        cls(**kwargs)
    except (ValueError, TypeError) as e:
        errors.add(path, f"{cls.__name__}: {e}")


def check_object(obj, where, errors):
    if not isinstance(obj, dict):
        errors.add(where, "a document that is not an object")
        return
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        errors.add(where, "missing apiVersion or kind")
        return
    meta = obj.get("metadata") or {}
    name = meta.get("name", "?") if isinstance(meta, dict) else "?"
    label = f"{where}: {kind} {name}"
    if isinstance(meta, dict):
        if kind in CLUSTER_SCOPED and "namespace" in meta:
            errors.add(label, f"{kind} is cluster-scoped and cannot have metadata.namespace "
                       f"({meta['namespace']!r}): keep it out of namespaced overlays")
    schema = crd_schemas.SCHEMAS.get((api_version, kind))
    if schema is not None:
        crd_schemas.check(schema, obj, kind, label, errors, check_model_by_name)
        return
    cls = model_class(api_version, kind)
    if cls is None:
        errors.add(label, f"no schema for {api_version} {kind}: add one to crd_schemas.py")
        return
    check_model(cls, obj, kind, _Prefixed(errors, label))


def check_model_by_name(model_name, value, path, errors):
    cls = getattr(models, model_name, None)
    if cls is None:
        errors.add(path, f"internal: unknown model {model_name}")
        return
    check_model(cls, value, path, errors)


class _Prefixed:
    def __init__(self, errors, prefix):
        self.errors, self.prefix = errors, prefix

    def add(self, where, msg):
        self.errors.add(f"{self.prefix}: {where}", msg)


def validate_documents(text, source):
    """Errors (strings) for every object of a multi-document YAML text."""
    errors = Errors()
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        return [f"{source}: not YAML: {e}"], 0
    n = 0
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        n += 1
        check_object(doc, f"{source}#{i}", errors)
    return errors.items, n


def main(argv):
    if models is None:
        print("k8s_validate: python3-kubernetes is not installed (scripts/install-deps.sh)", file=sys.stderr)
        return 2
    bad = 0
    for f in argv[1:]:
        text = sys.stdin.read() if f == "-" else open(f, encoding="utf-8").read()
        errs, n = validate_documents(text, f)
        for e in errs:
            print(e)
        bad += len(errs)
        print(f"{f}: {n} objects, {len(errs)} errors", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
