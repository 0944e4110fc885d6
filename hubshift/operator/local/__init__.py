"""hubshift/operator/local"""
