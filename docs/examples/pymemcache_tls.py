# pymemcache over TLS to a cluster started with `fawn up --memcached-tls`.
# Usage: python3 pymemcache_tls.py HOST PORT CA_FILE [USER PASSWORD]
import ssl
import sys

from pymemcache.client.base import Client

host, port, ca_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# Trust the cluster's CA (fawn up writes it to <data-dir>/tls/ca.pem); the server's
# certificate names the --memcached host, localhost, 127.0.0.1 and ::1.
context = ssl.create_default_context(cafile=ca_file)
client = Client((host, port), tls_context=context)
if len(sys.argv) > 5:
    # With --memcached-auth-file: log in first, as memcached's ASCII authentication.
    client.set("auth", f"{sys.argv[4]} {sys.argv[5]}", noreply=False)
client.set("greeting", "hello over TLS", noreply=False)
assert client.get("greeting") == b"hello over TLS"
print("ok")
