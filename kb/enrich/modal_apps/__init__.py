"""Modal apps (GPU work) and the code they share with the local backends.

Modal mounts the `kb` package into each container. So a module
here imports only the standard library, httpx and its own GPU libraries at
the top: never dagster, pydantic or another kb module.
"""
