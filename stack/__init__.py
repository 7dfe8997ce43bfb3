"""The launcher: the ``eventide`` command and the processes it starts on this machine.

``stack.cli`` is the command (``eventide stack up``, ``demo``, ``job``, ``gateway``, ``cluster ...``);
``stack.services`` runs each process detached with its pid and log files; ``stack.broker`` starts the local KRaft
Kafka broker (and its topics); ``stack.cluster`` the Spark standalone cluster and the multi-broker Kafka cluster;
``stack.demo_load`` is the demo's load, an app written with the SDK.

It starts every component (``ingest``, ``analytics``, ``store``, ``alerting``, ``dashboard``) and nothing in the
product imports it: the components share only ``eventide`` (configuration, jars, durable files, HTTP deadlines,
redaction). Tests and benchmarks use it to start what they measure.
"""
