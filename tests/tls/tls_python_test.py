"""The Python module over TLS and mTLS (docs/tls.md): pacer.Client with tls_ca (and tls_cert /
tls_key for mTLS) or the PACER_TLS_* environment connects to a TLS pacerd; without the files it
does not get through; plaintext to a non-loopback address is refused before anything is sent,
naming the flag. Certificates are made with openssl in the test's temp dir; pacerd is a real
subprocess on 127.0.0.1 port 0 (tests/python/pacerd_fixture.py)."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from pacerd_fixture import Pacerd, temp_dir  # noqa: E402

import pacer  # noqa: E402

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d):
    """CA, a server certificate for localhost / 127.0.0.1, a client certificate."""
    p = lambda n: os.path.join(d, n)  # noqa: E731
    openssl("req", "-x509", *EC, "-days", "2", "-subj", "/CN=py-ca", "-keyout", p("ca.key"), "-out", p("ca.pem"))
    for name, ext, serial in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1", "11"),
                              ("client", "extendedKeyUsage=clientAuth", "12")):
        with open(p(name + ".ext"), "w") as f:
            f.write(ext + "\n")
        openssl("req", *EC, "-subj", "/CN=" + name, "-keyout", p(name + ".key"), "-out", p(name + ".csr"))
        openssl("x509", "-req", "-in", p(name + ".csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
                "-set_serial", serial, "-days", "2", "-extfile", p(name + ".ext"), "-out", p(name + ".pem"))
    return p


def expect_error(fn, *needles):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - any SDK error; the message is what is checked
        for n in needles:
            assert n in str(e), f"{n!r} not in {e}"
        return
    raise AssertionError("expected an error")


def main():
    with temp_dir() as tmp:
        p = make_pki(tmp)
        for mtls in (False, True):
            sub = os.path.join(tmp, "mtls" if mtls else "tls")
            os.makedirs(sub)
            args = ["--tls-cert", p("server.pem"), "--tls-key", p("server.key")]
            if mtls:
                args += ["--tls-client-ca", p("ca.pem")]
            with Pacerd(sub, extra_args=args) as d:
                files = dict(tls_ca=p("ca.pem"))
                if mtls:
                    files.update(tls_cert=p("client.pem"), tls_key=p("client.key"))
                with pacer.Client(address=d.address, token=d.token, worker_id="py0", connect_budget_ms=5000,
                                  **files) as c:
                    c.register_dataset("py", num_records=16, shard_size=4)
                # The same through the environment.
                os.environ["PACER_TLS_CA"] = p("ca.pem")
                if mtls:
                    os.environ["PACER_TLS_CERT"] = p("client.pem")
                    os.environ["PACER_TLS_KEY"] = p("client.key")
                with pacer.Client(address=d.address, token=d.token, worker_id="py1", connect_budget_ms=5000):
                    pass
                for k in ("PACER_TLS_CA", "PACER_TLS_CERT", "PACER_TLS_KEY"):
                    os.environ.pop(k, None)
                # Without the files: plaintext (or no client certificate) never gets through.
                expect_error(lambda: pacer.Client(address=d.address, token=d.token, worker_id="py2",
                                                  connect_budget_ms=1000))
                if mtls:
                    expect_error(lambda: pacer.Client(address=d.address, token=d.token, worker_id="py3",
                                                      connect_budget_ms=1000, tls_ca=p("ca.pem")))
            print(("mTLS" if mtls else "TLS") + ": Python client connected with the files, refused without")
        expect_error(lambda: pacer.Client(address="10.255.255.1:7070", token="t", worker_id="py4"),
                     "--allow-insecure", "PACER_TLS_CA")
        expect_error(lambda: pacer.Client(address="127.attacker.example:7070", token="t", worker_id="py5"),
                     "--allow-insecure")
        expect_error(lambda: pacer.Client(address="127.0.0.1:1", token="t", worker_id="py6",
                                          tls_ca=os.path.join(tmp, "missing.pem")), "missing.pem")
        print("plaintext off loopback refused; a missing CA file named")


if __name__ == "__main__":
    main()
