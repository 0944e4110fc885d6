"""hubshift/eventhubs"""
