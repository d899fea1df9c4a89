def pil_to_tensor(*args, **kwargs):
    raise NotImplementedError("torchvision stand-in: no image transforms")
