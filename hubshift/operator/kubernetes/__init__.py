"""hubshift/operator/kubernetes"""
