"""Arguments and table configuration are checked where they are given, with typed errors."""

from __future__ import annotations

from typing import Any

import pytest

from txntable import (
    Consumer,
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable import config as cfg
from txntable.errors import (
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    InvalidTableNameError,
    RecordTooLargeError,
)

TP = TopicPartition("t", 0)


@pytest.fixture
def t(wh: Warehouse) -> Warehouse:
    wh.create_table("t", partitions=2)
    return wh


# --- Producer and Consumer arguments (item 8) -------------------------------------------


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("batch_size", -1, "batch_size must be >= 0, got -1"),
        ("batch_size", "16k", "batch_size must be an integer, not str '16k'"),
        ("batch_size", 1.5, "batch_size must be an integer"),
        ("batch_size", True, "batch_size must be an integer, not bool"),
        ("linger_ms", -5, "linger_ms must be >= 0, got -5"),
        ("max_block_ms", -1, "max_block_ms must be >= 0"),
        ("transaction_timeout_ms", -1, "transaction_timeout_ms must be >= 1"),
        ("transaction_timeout_ms", 0, "transaction_timeout_ms must be >= 1"),
        ("buffer_memory", 0, "buffer_memory must be >= 1"),
        ("max_request_size", None, "max_request_size must be an integer, not NoneType"),
        ("delivery_timeout_ms", -1, "delivery_timeout_ms must be >= 0"),
        ("enable_idempotence", "yes", "enable_idempotence must be True or False"),
        ("transactional_id", "", "transactional_id must be a non-empty string"),
        ("transactional_id", 7, "transactional_id must be a non-empty string"),
    ],
)
def test_producer_arguments_are_checked_at_construction(
    t: Warehouse, argument: str, value: Any, message: str
) -> None:
    with pytest.raises(InvalidConfigurationError, match=message):
        Producer(t, **{argument: value})


def test_producer_other_argument_errors(t: Warehouse) -> None:
    with pytest.raises(InvalidTableNameError, match="transactional_id"):
        Producer(t, transactional_id="a/b")
    with pytest.raises(InvalidConfigurationError, match="enable_idempotence"):
        Producer(t, transactional_id="tx", enable_idempotence=False)
    with pytest.raises(InvalidArgumentTypeError, match="warehouse must be a Warehouse, not str"):
        Producer("memory://somewhere")  # type: ignore[arg-type]


def test_a_record_larger_than_the_whole_buffer_says_so(t: Warehouse) -> None:
    with Producer(t, buffer_memory=10) as producer:
        with pytest.raises(RecordTooLargeError, match="buffer_memory is 10"):
            producer.send("t", value=b"x" * 100)


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("max_poll_records", -5, "max_poll_records must be >= 1, got -5"),
        ("max_poll_records", 0, "max_poll_records must be >= 1"),
        ("max_poll_records", "500", "max_poll_records must be an integer"),
        ("fetch_backoff_ms", -1, "fetch_backoff_ms must be >= 0"),
        ("isolation_level", "committed", "isolation_level must be one of"),
        ("auto_offset_reset", "smallest", "auto_offset_reset must be one of"),
        ("auto_commit_interval_ms", -1, "auto_commit_interval_ms must be >= 0"),
        ("group_generation", -2, "group_generation must be >= -1"),
        ("unstable_offset_timeout_ms", -1, "unstable_offset_timeout_ms must be >= 0"),
        ("enable_auto_commit", "true", "enable_auto_commit must be True or False"),
        ("group_id", "", "group_id must be a non-empty string"),
    ],
)
def test_consumer_arguments_are_checked_at_construction(
    t: Warehouse, argument: str, value: Any, message: str
) -> None:
    with pytest.raises(InvalidConfigurationError, match=message):
        Consumer(t, **{argument: value})


def test_auto_commit_without_a_group_is_refused_not_turned_off(t: Warehouse) -> None:
    with pytest.raises(InvalidConfigurationError, match="enable_auto_commit=True needs a group_id"):
        Consumer(t, enable_auto_commit=True)
    assert Consumer(t, enable_auto_commit=True, group_id="g").enable_auto_commit is True
    with pytest.raises(InvalidTableNameError, match="group_id"):
        Consumer(t, group_id="../g")


def test_heartbeat_must_be_below_the_session_timeout(t: Warehouse) -> None:
    # Kafka refuses it: a session would expire between two heartbeats.
    for heartbeat in (3000, 4000):
        with pytest.raises(InvalidConfigurationError, match="heartbeat_interval_ms .* lower"):
            Consumer(t, group_id="g", session_timeout_ms=3000, heartbeat_interval_ms=heartbeat)
    Consumer(t, group_id="g", session_timeout_ms=3000, heartbeat_interval_ms=2999).close()


def test_argument_tables_name_real_constructor_parameters() -> None:
    import inspect

    for cls, rows in ((Producer, cfg.PRODUCER_ARGUMENTS), (Consumer, cfg.CONSUMER_ARGUMENTS)):
        params = inspect.signature(cls.__init__).parameters
        assert set(rows) <= set(params), set(rows) - set(params)
        for name in rows:  # every default passes its own row
            rows[name](name, params[name].default)


# --- table configuration (item 9) -----------------------------------------------------------


def test_unknown_table_configuration_key_is_refused(wh: Warehouse) -> None:
    with pytest.raises(
        InvalidConfigurationError,
        match=r"unknown table configuration key 'chekpoint.interval' \(did you mean "
        r"checkpoint.interval\?\); known keys: checkpoint.interval",
    ):
        wh.create_table("t", configuration={"chekpoint.interval": "5"})
    assert wh.list_tables() == []  # nothing was written


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("retention.ms", "86400000"),
        ("retention.bytes", "1000000"),
        ("cleanup.policy", "compact"),
        ("cleanup.policy", "compact,delete"),
        ("segment.bytes", "1048576"),
        ("delete.retention.ms", "1000"),
        ("min.cleanable.dirty.ratio", "0.25"),
        ("producer.id.expiration.ms", "1000"),
        ("version.retention.ms", "3600000"),
        ("maintenance.interval.ms", "-1"),
        ("maintenance.merge.min.entries", "50"),
    ],
)
def test_maintenance_keys_are_accepted_and_stored(wh: Warehouse, key: str, value: str) -> None:
    wh.create_table("t", configuration={key: value})
    metadata = wh.table("t").snapshot().metadata
    assert metadata is not None and metadata.configuration == {key: value}


def test_keys_of_features_not_built_yet_are_refused(
    wh: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txntable import config

    future = config.TableConfigKey("future.feature", "1", str, "a later feature", False)
    monkeypatch.setitem(config.TABLE_CONFIG, future.name, future)
    with pytest.raises(InvalidConfigurationError, match="'future.feature' .* is not implemented"):
        wh.create_table("t", configuration={"future.feature": "2"})
    assert wh.list_tables() == []


@pytest.mark.parametrize(
    ("configuration", "message"),
    [
        ({"checkpoint.interval": "abc"}, "checkpoint.interval must be an integer >= 0"),
        ({"checkpoint.interval": "-1"}, "checkpoint.interval must be an integer >= 0"),
        ({"checkpoint.interval": 2.5}, "must be a string or an integer, not float"),
        ({"checkpoint.interval": True}, "must be a string or an integer, not bool"),
        ({5: "x"}, "configuration key 5 is not a string"),
        ([("checkpoint.interval", "5")], "configuration must be a mapping"),
    ],
)
def test_malformed_table_configuration_is_refused(
    wh: Warehouse, configuration: Any, message: str
) -> None:
    with pytest.raises(InvalidConfigurationError, match=message):
        wh.create_table("t", configuration=configuration)
    assert wh.list_tables() == []


def test_table_configuration_values_are_stored_as_strings(wh: Warehouse) -> None:
    table = wh.create_table("t", configuration={"checkpoint.interval": 7})
    meta = table.snapshot().metadata
    assert meta is not None and meta.configuration == {"checkpoint.interval": "7"}
    assert table.log.checkpoint_interval == 7


def test_every_registered_key_has_a_default_that_parses() -> None:
    for name, key in cfg.TABLE_CONFIG.items():
        assert key.name == name
        key.parse(key.default)
    assert cfg.table_setting({}, cfg.CHECKPOINT_INTERVAL) == cfg.CHECKPOINT_INTERVAL_DEFAULT
    assert cfg.table_setting({}, cfg.RETENTION_MS) == cfg.RETENTION_MS_DEFAULT


# --- argument types of calls (item 10) -------------------------------------------------------


def test_commit_with_an_int_instead_of_offset_and_metadata(t: Warehouse) -> None:
    consumer = Consumer(t, group_id="g")
    consumer.assign([TP])
    with pytest.raises(
        InvalidArgumentTypeError, match=r"offset for TopicPartition.* must be an OffsetAndMetadata"
    ):
        consumer.commit({TP: 5})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentTypeError, match="an offsets key must be a TopicPartition"):
        consumer.commit({("t", 0): OffsetAndMetadata(5)})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentTypeError, match="offsets must be a dict"):
        consumer.commit([OffsetAndMetadata(5)])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="OffsetAndMetadata.offset"):
        consumer.commit({TP: OffsetAndMetadata("5")})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        consumer.commit_async({TP: 5})  # type: ignore[dict-item]
    assert consumer.committed(TP) is None  # nothing was committed
    consumer.commit({TP: OffsetAndMetadata(1)})
    assert consumer.committed(TP) == OffsetAndMetadata(1)


def test_send_offsets_with_wrong_types_leaves_the_transaction_usable(t: Warehouse) -> None:
    producer = Producer(t, transactional_id="tx")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", value=b"v", partition=0)
    with pytest.raises(InvalidArgumentTypeError):
        producer.send_offsets_to_transaction({TP: 5}, "g")  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentTypeError, match="group_metadata must be"):
        producer.send_offsets_to_transaction({TP: OffsetAndMetadata(1)}, 42)  # type: ignore[arg-type]
    producer.send_offsets_to_transaction({TP: OffsetAndMetadata(1)}, ConsumerGroupMetadata("g"))
    producer.commit_transaction()
    producer.close()
    assert Consumer(t, group_id="g").committed(TP) == OffsetAndMetadata(1)


def test_consumer_calls_with_wrong_types(t: Warehouse) -> None:
    consumer = Consumer(t)
    for bad in (TP, ("t", 0), "t", [("t", 0)], 5):
        with pytest.raises(InvalidArgumentTypeError):
            consumer.assign(bad)  # type: ignore[arg-type]
    consumer.assign([TP])
    with pytest.raises(InvalidArgumentTypeError, match="partition must be a TopicPartition"):
        consumer.seek(("t", 0), 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        consumer.position("t-0")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        consumer.end_offsets(TP)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="timeout_ms must be an int"):
        consumer.poll(timeout_ms="100")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigurationError, match="max_records must be >= 1"):
        consumer.poll(max_records=0)


def test_producer_send_with_wrong_types(t: Warehouse) -> None:
    with Producer(t) as producer:
        with pytest.raises(InvalidArgumentTypeError, match="topic must be a str"):
            producer.send(TP, value=b"v")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentTypeError, match="partition must be an int"):
            producer.send("t", value=b"v", partition="0")  # type: ignore[arg-type]


def test_delete_records_with_wrong_types(t: Warehouse) -> None:
    table = t.table("t")
    for bad in ({"0": 1}, {0: "1"}, {0: None}, [(0, 1)]):
        with pytest.raises(InvalidArgumentTypeError):
            table.delete_records(bad)  # type: ignore[arg-type]
    assert table.describe().version == 0
