"""A job's trust: one secret per run of a job, from which come the CURVE keys of its tcp
sockets and the digest that guards its ZooKeeper nodes.

`bin/singa-run.sh` makes the secret (`new_secret`) for each run and hands it to the job's
processes out of band: in the environment (`SINGA_JOB_SECRET`) of the processes it starts,
on the standard input of its ssh sessions; it never goes to ZooKeeper or a command line.
Every key is derived from it (HMAC-SHA256 of the secret and the key's role), so a process
needs nothing else: its stub listens as the CURVE server of the job's server key, connects to
the other stubs with the job's client key, and admits only that client key (a ZAP handler).
A peer of another job, or of an earlier run of this one, holds other keys and is refused at
the handshake. The job's znodes carry the ACL `digest:singa:<hash>` (all) + `world:anyone`
(read): anyone may list the job, only its processes (and its launcher) may change it.
"""
import hashlib
import hmac
import os
import re
import secrets

import zmq
from zmq.utils import z85
from kazoo.security import Permissions, make_acl, make_digest_acl

from singa.errors import ConfigError

ENV = "SINGA_JOB_SECRET"
ZK_USER = "singa"


def new_secret():
    """32 random bytes as 64 hex digits."""
    return secrets.token_hex(32)


class JobTrust:
    """The keys and credentials of one run of a job, derived from its `secret`."""

    def __init__(self, secret):
        if not re.fullmatch(r"[0-9a-f]{64}", secret or ""):
            raise ConfigError(f"{ENV}: not a job secret (64 hex digits, as bin/singa-run.sh "
                              f"makes them)")
        self.secret = bytes.fromhex(secret)
        self.server_public, self.server_secret = self._keypair(b"curve server")
        self.client_public, self.client_secret = self._keypair(b"curve client")
        password = self._derive(b"zookeeper digest").hex()
        self.zk_auth = [("digest", f"{ZK_USER}:{password}")]
        self.zk_acl = [make_digest_acl(ZK_USER, password, all=True),
                       make_acl("world", "anyone", read=True)]
        self.zk_id = self.zk_acl[0].id

    @classmethod
    def from_env(cls):
        """The trust of the secret in the environment, or None when there is none."""
        secret = os.environ.get(ENV)
        return cls(secret.strip()) if secret else None

    def _derive(self, role):
        return hmac.new(self.secret, role, hashlib.sha256).digest()

    def _keypair(self, role):
        """(public, secret) Z85 CURVE keys of `role` (any 32 bytes are a Curve25519 secret)."""
        secret = z85.encode(self._derive(role))
        return zmq.curve_public(secret), secret

    def owns(self, acl):
        """Whether a znode's ACL list is this job's (its digest holds every permission)."""
        return any(a.id == self.zk_id and a.perms == Permissions.ALL for a in acl)
