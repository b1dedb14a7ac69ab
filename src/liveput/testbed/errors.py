"""The one error of the testbed: its infrastructure (etcd, namespaces) could not be set up."""


class TestbedError(RuntimeError):
    """etcd or a network namespace could not be started, reached or set up."""

    __test__ = False  # not a pytest test class, whatever its name
