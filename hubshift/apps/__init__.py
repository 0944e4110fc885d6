"""hubshift/apps"""
