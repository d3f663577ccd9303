"""The actor layer: supervised pykka actors and the conversation actors built on them."""
