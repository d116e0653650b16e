"""Small structural schemas for the custom resources (and post-1.22 core kinds) in deploy/.

Written from each project's API reference for the fields Pacer's manifests use and their close
neighbours — not the whole CRD: an object that uses a field missing here fails with "unknown
field", and the field is then added here deliberately. Every object is closed (an unknown key
is an error) unless marked "open". A {"model": NAME} node hands the value to the
python3-kubernetes model NAME (a pod or job template inside a JobSet, a PyTorchJob, ...).

Node forms: {"type": "object", "properties": {...}, "required": [...]}, {"type": "array",
"items": S}, {"type": "map", "values": S}, {"type": "string"|"integer"|"boolean"|"number",
"enum": [...]}, {"model": NAME}, {"type": "any"}.
"""

S = {"type": "string"}
I = {"type": "integer"}
B = {"type": "boolean"}
ANY = {"type": "any"}
STRINGS = {"type": "array", "items": S}
STRMAP = {"type": "map", "values": S}
META = {"model": "V1ObjectMeta"}


def obj(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required)}


def arr(items):
    return {"type": "array", "items": items}


def kind(spec, required_spec=True):
    props = {"apiVersion": S, "kind": S, "metadata": META, "spec": spec}
    return obj(props, ["apiVersion", "kind", "metadata"] + (["spec"] if required_spec else []))


# --- monitoring.coreos.com/v1 (Prometheus Operator) ---
_TLS = obj({"ca": ANY, "cert": ANY, "keySecret": ANY, "serverName": S, "insecureSkipVerify": B,
            "caFile": S, "certFile": S, "keyFile": S})
_ENDPOINT = obj({"port": S, "targetPort": ANY, "path": S, "scheme": {"type": "string", "enum": ["http", "https"]},
                 "interval": S, "scrapeTimeout": S, "honorLabels": B, "honorTimestamps": B,
                 "tlsConfig": _TLS, "params": {"type": "map", "values": STRINGS},
                 "relabelings": arr(ANY), "metricRelabelings": arr(ANY)})
_NS_SELECTOR = obj({"any": B, "matchNames": STRINGS})
SERVICE_MONITOR = kind(obj({"selector": {"model": "V1LabelSelector"}, "endpoints": arr(_ENDPOINT),
                            "namespaceSelector": _NS_SELECTOR, "jobLabel": S, "targetLabels": STRINGS,
                            "podTargetLabels": STRINGS, "sampleLimit": I},
                           ["selector", "endpoints"]))
_POD_METRICS_ENDPOINT = obj({"port": S, "path": S, "scheme": {"type": "string", "enum": ["http", "https"]},
                             "interval": S, "scrapeTimeout": S, "honorLabels": B, "tlsConfig": _TLS,
                             "relabelings": arr(ANY), "metricRelabelings": arr(ANY)})
POD_MONITOR = kind(obj({"selector": {"model": "V1LabelSelector"}, "podMetricsEndpoints": arr(_POD_METRICS_ENDPOINT),
                        "namespaceSelector": _NS_SELECTOR, "jobLabel": S, "podTargetLabels": STRINGS},
                       ["selector"]))

# --- jobset.x-k8s.io/v1alpha2 ---
_REPLICATED_JOB = obj({"name": S, "replicas": I, "template": {"model": "V1JobTemplateSpec"},
                       "dependsOn": arr(obj({"name": S, "status": S}))}, ["name", "template"])
JOBSET_SPEC = obj({
    "replicatedJobs": arr(_REPLICATED_JOB),
    "network": obj({"enableDNSHostnames": B, "subdomain": S, "publishNotReadyAddresses": B}),
    "successPolicy": obj({"operator": {"type": "string", "enum": ["All", "Any"]}, "targetReplicatedJobs": STRINGS},
                         ["operator"]),
    "failurePolicy": obj({"maxRestarts": I, "restartStrategy": S,
                          "rules": arr(obj({"name": S, "action": S, "onJobFailureReasons": STRINGS,
                                            "targetReplicatedJobs": STRINGS}))}),
    "startupPolicy": obj({"startupPolicyOrder": {"type": "string", "enum": ["AnyOrder", "InOrder"]}}),
    "suspend": B, "ttlSecondsAfterFinished": I, "managedBy": S,
})
JOBSET = kind(JOBSET_SPEC)

# --- kubeflow.org/v1 (Training Operator) ---
_REPLICA_SPEC = obj({"replicas": I, "restartPolicy": {"type": "string", "enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                     "template": {"model": "V1PodTemplateSpec"}}, ["template"])
_RUN_POLICY = obj({"cleanPodPolicy": {"type": "string", "enum": ["All", "Running", "None"]}, "backoffLimit": I,
                   "activeDeadlineSeconds": I, "ttlSecondsAfterFinished": I, "suspend": B, "managedBy": S,
                   "schedulingPolicy": obj({"minAvailable": I, "queue": S, "priorityClass": S,
                                            "minResources": STRMAP, "scheduleTimeoutSeconds": I})})
PYTORCH_JOB = kind(obj({
    "pytorchReplicaSpecs": {"type": "map", "values": _REPLICA_SPEC, "keys": ["Master", "Worker"]},
    "runPolicy": _RUN_POLICY,
    "elasticPolicy": obj({"minReplicas": I, "maxReplicas": I, "rdzvBackend": S, "rdzvPort": I, "rdzvHost": S,
                          "rdzvId": S, "maxRestarts": I, "nProcPerNode": I, "metrics": arr(ANY)}),
    "nprocPerNode": S,
}, ["pytorchReplicaSpecs"]))

# --- trainer.kubeflow.org/v1alpha1 (Kubeflow Trainer v2) ---
_TRAINER = obj({"image": S, "command": STRINGS, "args": STRINGS, "env": arr({"model": "V1EnvVar"}),
                "numNodes": I, "resourcesPerNode": {"model": "V1ResourceRequirements"}, "numProcPerNode": ANY})
TRAIN_JOB = kind(obj({
    "runtimeRef": obj({"name": S, "apiGroup": S, "kind": {"type": "string", "enum": ["TrainingRuntime", "ClusterTrainingRuntime"]}},
                      ["name"]),
    "trainer": _TRAINER,
    "labels": STRMAP, "annotations": STRMAP, "suspend": B, "managedBy": S,
}, ["runtimeRef"]))
TRAINING_RUNTIME = kind(obj({
    "mlPolicy": obj({"numNodes": I, "torch": obj({"numProcPerNode": ANY, "elasticPolicy": ANY})}),
    "podGroupPolicy": ANY,
    "template": obj({"metadata": META, "spec": JOBSET_SPEC}, ["spec"]),
}, ["template"]))

# --- cert-manager.io/v1 ---
_ISSUER_REF = obj({"name": S, "kind": {"type": "string", "enum": ["Issuer", "ClusterIssuer"]}, "group": S}, ["name"])
_USAGES = ["signing", "digital signature", "content commitment", "key encipherment", "key agreement",
           "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
           "server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
           "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"]
CERTIFICATE = kind(obj({
    "secretName": S, "commonName": S, "dnsNames": STRINGS, "ipAddresses": STRINGS, "uris": STRINGS,
    "duration": S, "renewBefore": S, "isCA": B, "issuerRef": _ISSUER_REF,
    "usages": arr({"type": "string", "enum": _USAGES}),
    "privateKey": obj({"algorithm": {"type": "string", "enum": ["RSA", "ECDSA", "Ed25519"]}, "size": I,
                       "encoding": {"type": "string", "enum": ["PKCS1", "PKCS8"]},
                       "rotationPolicy": {"type": "string", "enum": ["Never", "Always"]}}),
    "subject": obj({"organizations": STRINGS, "organizationalUnits": STRINGS, "countries": STRINGS}),
    "secretTemplate": obj({"labels": STRMAP, "annotations": STRMAP}),
}, ["secretName", "issuerRef"]))
ISSUER = kind(obj({"selfSigned": obj({"crlDistributionPoints": STRINGS}), "ca": obj({"secretName": S}, ["secretName"])}))

# --- admissionregistration.k8s.io/v1 (Kubernetes 1.30; after python3-kubernetes 22.6) ---
_RULE = obj({"apiGroups": STRINGS, "apiVersions": STRINGS, "operations": arr({"type": "string", "enum": ["*", "CREATE", "UPDATE", "DELETE", "CONNECT"]}),
             "resources": STRINGS, "scope": S})
VAP = kind(obj({
    "failurePolicy": {"type": "string", "enum": ["Fail", "Ignore"]},
    "matchConstraints": obj({"resourceRules": arr(_RULE), "namespaceSelector": {"model": "V1LabelSelector"},
                             "objectSelector": {"model": "V1LabelSelector"}}),
    "matchConditions": arr(obj({"name": S, "expression": S}, ["name", "expression"])),
    "validations": arr(obj({"expression": S, "message": S, "messageExpression": S, "reason": S}, ["expression"])),
    "variables": arr(obj({"name": S, "expression": S}, ["name", "expression"])),
    "auditAnnotations": arr(obj({"key": S, "valueExpression": S})),
}))
VAP_BINDING = kind(obj({
    "policyName": S,
    "validationActions": arr({"type": "string", "enum": ["Deny", "Warn", "Audit"]}),
    "matchResources": ANY, "paramRef": ANY,
}, ["policyName", "validationActions"]))

SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): JOBSET,
    ("kubeflow.org/v1", "PyTorchJob"): PYTORCH_JOB,
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): TRAIN_JOB,
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): TRAINING_RUNTIME,
    ("cert-manager.io/v1", "Certificate"): CERTIFICATE,
    ("cert-manager.io/v1", "Issuer"): ISSUER,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): VAP,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): VAP_BINDING,
}

_PY_TYPES = {"string": (str,), "integer": (int,), "boolean": (bool,), "number": (int, float)}


def check(schema, value, path, label, errors, check_model):
    """Appends to `errors` (an object with add(where, msg)) every way `value` breaks `schema`."""
    where = f"{label}: {path}"
    if "model" in schema:
        check_model(schema["model"], value, where, errors)
        return
    t = schema["type"]
    if t == "any":
        return
    if t == "object":
        if not isinstance(value, dict):
            errors.add(where, f"expected an object, got {type(value).__name__} {value!r}")
            return
        props = schema["properties"]
        for k, v in value.items():
            if k not in props:
                errors.add(f"{where}.{k}", f"unknown field '{k}' (known: {', '.join(sorted(props))})")
                continue
            check(props[k], v, f"{path}.{k}", label, errors, check_model)
        for k in schema.get("required", []):
            if k not in value:
                errors.add(where, f"missing required field '{k}'")
        return
    if t == "array":
        if not isinstance(value, list):
            errors.add(where, f"expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check(schema["items"], v, f"{path}[{i}]", label, errors, check_model)
        return
    if t == "map":
        if not isinstance(value, dict):
            errors.add(where, f"expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            if "keys" in schema and k not in schema["keys"]:
                errors.add(f"{where}.{k}", f"unknown key '{k}' (known: {', '.join(schema['keys'])})")
                continue
            check(schema["values"], v, f"{path}.{k}", label, errors, check_model)
        return
    ok = isinstance(value, _PY_TYPES[t]) and not (t != "boolean" and isinstance(value, bool))
    if not ok:
        errors.add(where, f"expected a {t}, got {type(value).__name__} {value!r}")
    elif "enum" in schema and value not in schema["enum"]:
        errors.add(where, f"must be one of {schema['enum']}, not {value!r}")
