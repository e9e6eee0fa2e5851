"""attnconv.data"""
