"""The contract between the producer and the workers, and the only package both import.

The job and result schema, the Redis key names, routing (partitions, prefix keys), the queue
epoch, heartbeat and status records, opening Redis and creating a queue's consumer groups, and
the small process and Redis-error plumbing both sides share. It imports neither ``producer``
nor ``worker``, and no torch.
"""
