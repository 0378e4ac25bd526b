"""Transactions across tables: the coordinator object and recovery of stuck transactions."""
