"""hubshift/consumer/spark"""
