"""The client side of the per-user server (pyree_build/server/): the wire protocol
(protocol.py), the plans of passing `run`s the native client replays without the server
(plans.py), and the native client itself (transport.c: to the server; plan_runner.c: a plan's
run; native.py builds them).

Nothing is imported here: the Python client (server/client.py) imports protocol.py alone
before the server answers, and its start-up is its whole cost.
"""
