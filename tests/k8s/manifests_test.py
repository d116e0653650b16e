"""k8s_manifests_test: deploy/ builds with kustomize and every object validates offline.

For deploy/overlays/dev, deploy/overlays/prod, deploy/overlays/ha, deploy/cluster and deploy/examples:
  1. `kubectl kustomize DIR` succeeds (the machine's kubectl; Debian's kubernetes-client where
     none is installed, see scripts/install-deps.sh);
  2. every object passes k8s_validate (python3-kubernetes models, crd_schemas.py): no unknown
     field, types right, required fields present, nothing cluster-scoped with a namespace;
  3. the properties the deployment promises hold on the rendered objects (one pacerd replica
     with its data dir on a claim, non-root, read-only root, probes, mTLS only in prod, every
     training pod template avoids the node label its agent sets, identity from the downward API,
     every pod template within Pod Security Standards "restricted", which prod enforces).
Then typos — in a core object, in a pod template inside a custom resource, in a custom resource
itself — and a wrong type and a misplaced namespace must each fail with the path named.

Usage: manifests_test.py SOURCE_DIR. Exit 0 pass, 1 fail, 77 skipped (no kubectl at all).
"""
import os
import shutil
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_validate  # noqa: E402

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL:", msg)


def kustomize(kubectl, path):
    p = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def containers(pod_spec):
    return list(pod_spec.get("initContainers") or []) + list(pod_spec.get("containers") or [])


def pod_templates(obj):
    """(where, pod spec) of every pod template in a rendered object."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind in ("StatefulSet", "Deployment", "Job", "DaemonSet"):
        yield kind, spec["template"]["spec"]
    elif kind == "JobSet":
        for rj in spec["replicatedJobs"]:
            yield f"JobSet/{rj['name']}", rj["template"]["spec"]["template"]["spec"]
    elif kind == "PyTorchJob":
        for role, rs in spec["pytorchReplicaSpecs"].items():
            yield f"PyTorchJob/{role}", rs["template"]["spec"]
    elif kind == "TrainingRuntime":
        for rj in spec["template"]["spec"]["replicatedJobs"]:
            yield f"TrainingRuntime/{rj['name']}", rj["template"]["spec"]["template"]["spec"]


def flag(args, name):
    for a in args or []:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def check_ha(objs):
    """deploy/overlays/ha: prod's pacerd as 3 replicas electing a leader in etcd (docs/ha.md)."""
    sts = [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "pacerd"]
    check(len(sts) == 1, "ha: one pacerd StatefulSet")
    if not sts:
        return
    s = sts[0]["spec"]
    check(s["replicas"] == 3, "ha: three pacerd replicas")
    check(s.get("podManagementPolicy") == "Parallel", "ha: replicas start together (a standby is never Ready)")
    anti = s["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    check(any(t.get("topologyKey") == "kubernetes.io/hostname" for t in terms), "ha: one replica per node")
    c = s["template"]["spec"]["containers"][0]
    journal = flag(c["args"], "journal") or ""
    check(journal.startswith("etcds://"), f"ha: the journal is in etcd over TLS: {journal!r}")
    for f in ("etcd-cacert", "etcd-cert", "etcd-key"):
        path = flag(c["args"], f) or ""
        check(any(path.startswith(m["mountPath"] + "/") for m in c["volumeMounts"]), f"ha: --{f} {path} is mounted")
    check("livenessProbe" not in c and "startupProbe" not in c, "ha: no probe restarts a standby")
    check("readinessProbe" in c, "ha: readiness keeps standbys out of the Service")
    check("volumeClaimTemplates" not in s, "ha: no claim (the journals live in etcd)")
    check(flag(c["args"], "tls-client-ca") is not None, "ha: mTLS as in prod")


def check_pacerd(objs, overlay, mtls):
    sts = [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "pacerd"]
    check(len(sts) == 1, f"{overlay}: one pacerd StatefulSet")
    if not sts:
        return
    s = sts[0]["spec"]
    check(s["replicas"] == 1, f"{overlay}: pacerd has exactly one replica")
    claims = [c["metadata"]["name"] for c in s.get("volumeClaimTemplates", [])]
    check("data" in claims, f"{overlay}: pacerd's data dir is a PersistentVolumeClaim")
    pod = s["template"]["spec"]
    c = pod["containers"][0]
    check(pod["securityContext"].get("runAsNonRoot") is True, f"{overlay}: pacerd runs as non-root")
    check(c["securityContext"].get("readOnlyRootFilesystem") is True, f"{overlay}: read-only root filesystem")
    check(c["securityContext"].get("allowPrivilegeEscalation") is False, f"{overlay}: no privilege escalation")
    check(pod.get("automountServiceAccountToken") is False, f"{overlay}: pacerd mounts no API token")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    data_dir = flag(c["args"], "data-dir")
    check(data_dir is not None and any(data_dir.startswith(p + "/") for p, m in mounts.items()
                                       if m["name"] == "data"),
          f"{overlay}: --data-dir {data_dir} lies on the data volume")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        cmd = c.get(probe, {}).get("exec", {}).get("command", [])
        check(cmd and cmd[0].endswith("/pacer-probe"), f"{overlay}: {probe} runs pacer-probe")
        check(("--tls-cert=/etc/pacer/tls/tls.crt" in cmd) == mtls,
              f"{overlay}: {probe} presents a client certificate exactly when mTLS is on")
    check(flag(c["args"], "tls-cert") and flag(c["args"], "tls-key"), f"{overlay}: pacerd serves TLS")
    check((flag(c["args"], "tls-client-ca") is not None) == mtls, f"{overlay}: mTLS {'on' if mtls else 'off'}")
    check("--allow-insecure" not in c["args"], f"{overlay}: no plaintext")
    check(c["resources"]["requests"] and c["resources"]["limits"], f"{overlay}: resources set")
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    check({"pacerd-tokens", "pacerd-tls"} <= secrets, f"{overlay}: tokens and TLS come from Secrets")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for k in (("Service", "pacerd"), ("NetworkPolicy", "pacerd"), ("Role", "pacer-agent-self-delete"),
              ("RoleBinding", "pacer-agent-self-delete"), ("ServiceAccount", "pacer-agent")):
        check(k in kinds, f"{overlay}: has {k[0]} {k[1]}")
    role = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "pacer-agent-self-delete"][0]
    check(role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}],
          f"{overlay}: the agent's Role grants delete on pods and nothing else: {role['rules']}")
    ns = {o["metadata"].get("namespace") for o in objs if o["kind"] not in k8s_validate.CLUSTER_SCOPED}
    check(len(ns) == 1 and None not in ns, f"{overlay}: every namespaced object in one namespace: {ns}")


def trainjob_pods(objs):
    """A TrainJob's trainer fills the `node` container of its runtime's pod template: yield that
    template with the TrainJob's command and args merged in, as Kubeflow Trainer does."""
    runtimes = {o["metadata"]["name"]: o for o in objs if o["kind"] == "TrainingRuntime"}
    for o in objs:
        if o["kind"] != "TrainJob":
            continue
        rt = runtimes.get(o["spec"]["runtimeRef"]["name"])
        check(rt is not None, f"TrainJob {o['metadata']['name']}: its TrainingRuntime is among the examples")
        if rt is None:
            continue
        for where, pod in pod_templates(rt):
            pod = yaml.safe_load(yaml.safe_dump(pod))  # a copy
            for c in pod["containers"]:
                if c["name"] == "node":
                    c["command"] = o["spec"]["trainer"].get("command")
                    c["args"] = o["spec"]["trainer"].get("args")
            yield o, f"TrainJob via {where}", pod


def check_training_pods(objs):
    seen = 0
    templates = [(o, where, pod) for o in objs if o["kind"] != "TrainingRuntime"
                 for where, pod in pod_templates(o)] + list(trainjob_pods(objs))
    for o, where, pod in templates:
        if True:
            agents = [c for c in containers(pod) if (c.get("command") or [""])[0].endswith("/pacer-agent")]
            if not agents:
                continue
            seen += 1
            a = agents[0]
            name = f"{o['kind']} {o['metadata']['name']} ({where})"
            job = flag(a.get("args"), "job")
            check(job, f"{name}: the agent has --job")
            terms = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
                     .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
            wanted = {"key": f"bad-node.pacer.dev/{job}", "operator": "DoesNotExist"}
            check(terms and all(wanted in t.get("matchExpressions", []) for t in terms),
                  f"{name}: the pod template must avoid nodes labelled {wanted['key']} (what --k8s-mark-node sets)")
            if "--k8s-mark-node" in (a.get("args") or []):
                env = {e["name"]: e for e in a.get("env") or []}
                for var, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                                  ("POD_UID", "metadata.uid"), ("NODE_NAME", "spec.nodeName"),
                                  ("PACER_NODE", "spec.nodeName")):
                    got = env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                    check(got == path, f"{name}: {var} from the downward API {path}, not {got}")
            check(pod.get("serviceAccountName") == "pacer-agent", f"{name}: runs as the pacer-agent account")
            args = a.get("args") or []
            check(flag(args, "tls-ca") and flag(args, "tls-cert") and flag(args, "tls-key")
                  and "--allow-insecure" not in args,
                  f"{name}: the agent dials pacerd over TLS with a client certificate (prod is mTLS)")
            if "--attach" in " ".join(a.get("args") or []):
                check(pod.get("shareProcessNamespace") is True, f"{name}: --attach needs shareProcessNamespace")
                check(a.get("restartPolicy") == "Always" and a in (pod.get("initContainers") or []),
                      f"{name}: the sidecar agent is a native sidecar (init container, restartPolicy Always)")
    check(seen >= 5, f"examples: {seen} pod templates run pacer-agent (Job, JobSet, PyTorchJob x2, TrainJob)")


def check_restricted(objs, where):
    """Pod Security Standards 'restricted' (the prod namespace enforces it) for every pod template."""
    templates = [(o, w, pod) for o in objs if o["kind"] != "TrainingRuntime" for w, pod in pod_templates(o)]
    templates += list(trainjob_pods(objs))
    for o, w, pod in templates:
        name = f"{where}: {o['kind']} {o['metadata']['name']} ({w})"
        psc = pod.get("securityContext") or {}
        check(not (pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC")), f"{name}: no host namespaces")
        check(not any("hostPath" in v for v in pod.get("volumes") or []), f"{name}: no hostPath volumes")
        for v in pod.get("volumes") or []:
            if "secret" in v:
                mode = v["secret"].get("defaultMode", 0o644)  # the API's default
                check(mode & 0o007 == 0 and psc.get("fsGroup") is not None,
                      f"{name}: Secret volume {v['name']} must not be readable by others (defaultMode "
                      f"{oct(mode)}; Pacer refuses such token files) and the pod needs an fsGroup to read it")
        for c in containers(pod):
            sc = c.get("securityContext") or {}
            cn = f"{name} container {c['name']}"
            check(sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"{cn}: runAsNonRoot")
            check((sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost"),
                  f"{cn}: a seccomp profile")
            check(sc.get("allowPrivilegeEscalation") is False, f"{cn}: allowPrivilegeEscalation false")
            check("ALL" in ((sc.get("capabilities") or {}).get("drop") or []), f"{cn}: drops ALL capabilities")
            check(not sc.get("privileged"), f"{cn}: not privileged")
            check(sc.get("readOnlyRootFilesystem") is True, f"{cn}: read-only root filesystem")


def expect_invalid(text, must_contain, what):
    errs, _ = k8s_validate.validate_documents(text, what)
    check(errs and any(must_contain in e for e in errs),
          f"negative '{what}': expected an error containing {must_contain!r}, got {errs}")
    if errs:
        print(f"  (as expected) {errs[0][:200]}")


def main():
    src = sys.argv[1]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("SKIP: no kubectl on this machine (scripts/install-deps.sh installs Debian's "
              "kubernetes-client where none is)")
        return 77
    if k8s_validate.models is None:
        print("FAIL: python3-kubernetes is missing (scripts/install-deps.sh installs it)")
        return 1
    print("kubectl:", kubectl)
    rendered = {}
    for d, n_min in (("deploy/overlays/dev", 8), ("deploy/overlays/prod", 11), ("deploy/overlays/ha", 11),
                     ("deploy/cluster", 2), ("deploy/examples", 10)):
        rc, out, err = kustomize(kubectl, os.path.join(src, d))
        check(rc == 0, f"kubectl kustomize {d} failed: {err.strip()}")
        if rc != 0:
            continue
        errs, n = k8s_validate.validate_documents(out, d)
        for e in errs:
            check(False, e)
        check(n >= n_min, f"{d}: {n} objects, expected at least {n_min}")
        rendered[d] = out
        print(f"{d}: {n} objects valid")
    objs = {d: [o for o in yaml.safe_load_all(t) if o] for d, t in rendered.items()}
    if "deploy/overlays/dev" in objs:
        check_pacerd(objs["deploy/overlays/dev"], "dev", mtls=False)
    if "deploy/overlays/prod" in objs:
        prod = objs["deploy/overlays/prod"]
        check_pacerd(prod, "prod", mtls=True)
        kinds = {o["kind"] for o in prod}
        check("ServiceMonitor" in kinds and "ClusterRole" in kinds, "prod: ServiceMonitor and node marking")
        crb = [o for o in prod if o["kind"] == "ClusterRoleBinding"][0]
        check(crb["subjects"][0].get("namespace") == "pacer", "prod: the node marker binds the agent of namespace pacer")
    if "deploy/overlays/ha" in objs:
        check_ha(objs["deploy/overlays/ha"])
    if "deploy/examples" in objs:
        check_training_pods(objs["deploy/examples"])
    for d in ("deploy/overlays/dev", "deploy/overlays/prod", "deploy/overlays/ha", "deploy/examples"):
        if d in objs:
            check_restricted(objs[d], d)

    # Negative: a typo must fail, with the field named.
    prod = rendered.get("deploy/overlays/prod", "")
    ex = rendered.get("deploy/examples", "")
    check("readOnlyRootFilesystem" in prod and "pytorchReplicaSpecs" in ex, "negative tests have their targets")
    expect_invalid(prod.replace("readOnlyRootFilesystem", "readOnlyRootFilesytem", 1),
                   "unknown field 'readOnlyRootFilesytem'", "typo in a StatefulSet")
    expect_invalid(prod.replace("replicas: 1", "replicas: one", 1), "expected an integer", "wrong type")
    expect_invalid(ex.replace("pytorchReplicaSpecs", "pytorchReplicaSpec", 1), "unknown field 'pytorchReplicaSpec'",
                   "typo in a PyTorchJob")
    expect_invalid(ex.replace("shareProcessNamespace", "shareProcessNamespaces", 1),
                   "unknown field 'shareProcessNamespaces'", "typo in a Job's pod template")
    expect_invalid(ex.replace("enableDNSHostnames", "enableDnsHostnames", 1), "unknown field 'enableDnsHostnames'",
                   "typo in a JobSet")
    expect_invalid(ex.replace("fieldPath: spec.nodeName", "fieldPth: spec.nodeName", 1), "unknown field 'fieldPth'",
                   "typo in a pod template inside a custom resource")
    expect_invalid(ex.replace("renewBefore", "renewBefor", 1), "unknown field 'renewBefor'", "typo in a Certificate")
    expect_invalid(ex.replace("restartPolicy: Always", "restartPolicy: Sometimes", 1), "must be one of",
                   "a sidecar restartPolicy that does not exist")
    cluster = rendered.get("deploy/cluster", "")
    expect_invalid(cluster.replace("metadata:\n", "metadata:\n  namespace: pacer\n", 1), "cluster-scoped",
                   "a namespace on a cluster-scoped object")
    expect_invalid("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - image: x\n",
                   "must not be `None`", "a missing required field")
    expect_invalid("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n", "no schema",
                   "a kind nobody validates")

    # And kustomize itself refuses a misspelt kustomization field.
    import tempfile
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
            f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresourcse:\n  - x.yaml\n")
        rc, _, err = kustomize(kubectl, tmp)
        check(rc != 0, "kubectl kustomize accepted a misspelt kustomization field 'resourcse'")

    if FAILURES:
        print(f"{len(FAILURES)} failed")
        return 1
    print("k8s_manifests_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
