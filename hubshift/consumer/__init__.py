"""The consumer process: a local-mode Spark driver reading the partitions this consumer owns."""
