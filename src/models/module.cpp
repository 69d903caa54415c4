// placeholder so the module library is never empty
