"""Fixtures of the cluster-job tests on sites (docs/cluster-jobs.md, "Sites"; issue 9 §6): a Slurm
site whose launcher, sshd login node and two-node Slurm (n1 and n2 on this host) are all real, and
cluster Jobs created the way people create them. The API tests reuse tests/sites' launcher and site
helpers. Tests that start the real Slurm run under flock /tmp/mado-schedulers.lock."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jobs import services as job_services
from jobs.models import Job
from mado.services import Actor
from tests.peers.sshd import sshd  # noqa: F401  (session fixture)
from tests.site_agent.site_world import registered, server  # noqa: F401  (fixtures)
from tests.site_e2e.conftest import Site, login_home, open_site, settle, slurm_job_shell  # noqa: F401
from tests.sites.conftest import host_keys  # noqa: F401  (session fixture)
from tests.sites.site_jobs import no_expiry_throttle  # noqa: F401  (autouse)


@pytest.fixture(scope="session")
def two_node_conf(login_home, slurm_two_nodes) -> Path:  # noqa: F811  (slurm_two_nodes: a plugin of tests/conftest)
    """The two-node cluster's slurm.conf where the login user can read it."""
    conf = login_home / "slurm-two-nodes.conf"
    shutil.copy(slurm_two_nodes.conf, conf)
    conf.chmod(0o644)
    return conf


class ClusterSite(Site):
    def cluster_job(self, code: str, size: int = 2, **fields) -> Job:
        """A python-runtime cluster Job of `size` replicas running `python -c code`, created by alice."""
        job = job_services.create_job(Actor(self.world.project_admin), self.world.project,
                                      {"computer": self.target.pk, "runtime": "python", "cluster_size": size,
                                       "command": ["python", "-c", code], **fields})
        self.jobs.append(job.pk)
        return job


@pytest.fixture
def two_node_site(server, registered, world, sshd, slurm_two_nodes, two_node_conf, login_home,  # noqa: F811
                  tmp_path):
    site = open_site(world, server, registered, sshd, tmp_path, login_home / "work-cluster",
                     job_shell=slurm_job_shell(), variables=f"SLURM_CONF={two_node_conf}\nPARTITION=debug")
    site.__class__ = ClusterSite
    yield site
    settle(site, lambda i: slurm_two_nodes.run("scancel", i, check=False), lambda i: bool(slurm_two_nodes.queue(i)))
