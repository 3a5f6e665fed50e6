"""LightningDataModules: Fashion-MNIST variants, FashionScenes captions, COCO/Flickr captions."""
