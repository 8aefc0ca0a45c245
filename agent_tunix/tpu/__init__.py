"""Devices: the mesh and the TPU topologies we compile for.

sharding (mesh from config, partition specs for weights, batches and the KV
cache, multi-host row bookkeeping) and topology (slice names such as
'v5litepod-8' -> TPU devices from libtpu, without a TPU). This is a bottom
layer: it imports no other part of agent_tunix.
"""
