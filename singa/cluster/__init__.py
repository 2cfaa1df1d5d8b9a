"""A job across processes and hosts: ZooKeeper, the cluster runtime, job manager, launch checks, singatool."""
