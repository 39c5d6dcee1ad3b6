"""PySpark jobs over the lake. Nothing in this package imports Django: spark-submit runs the jobs
on any Spark master with only PySpark and this package on the driver's path."""
