"""The per-user pyree_build server and its Python client: each `pyree-build` command is a
thin client whose work a warm, forked worker of the server does (daemon.py, and the modules
it ties), or the command runs in process when the server is off or cannot start (client.py)."""
