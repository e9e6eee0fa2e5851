"""attnconv.analysis"""
