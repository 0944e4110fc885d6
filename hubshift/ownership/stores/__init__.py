"""hubshift/ownership/stores"""
