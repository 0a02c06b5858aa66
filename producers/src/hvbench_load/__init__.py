"""hvbench's messaging side and run harness: the Kafka broker, the open-loop producers, the
consumer that stamps results, the accounting of every record, and `make run` itself."""
