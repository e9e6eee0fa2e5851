"""attnconv.train"""
