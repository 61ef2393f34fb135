"""Asks Ray's autoscaler for the CPUs a run wants, and gives them back when it ends.

    from pgpong import capacity
    capacity.request(300)    # one CPU per rollout actor wanted: the autoscaler starts the nodes they need
    ...                      # train; the pool takes the actors of each node as it joins
    capacity.release()       # nothing asked any more: idle workers leave after idle_timeout_minutes

This is Ray's own ray.autoscaler.sdk.request_resources, chosen over pending actors (why:
docs/aws.md, A cluster that grows and shrinks). A request is not held back by upscaling_speed, so
every node it needs starts at once, and the autoscaler removes no node the request still needs. A request
outlives the driver that made it, until the next one replaces it: release() at the end of a run. On
a cluster without an autoscaler (a local head, `make train`) a request is recorded and changes
nothing.
"""

from ray.autoscaler.sdk import request_resources


def request(cpus):
    """Ask for a cluster that holds `cpus` one-CPU actors at once, replacing any earlier request.
    The autoscaler adds what the running nodes lack, up to the cluster's max_workers."""
    request_resources(bundles=[{"CPU": 1}] * cpus)


def release():
    """Withdraw the request: the cluster may shrink back to its min_workers."""
    request_resources(bundles=[])
