"""Param confs of the Python API (SINGA 0.3's tool/python/singa/parameter.py): `Parameter` and `set_param_field`."""
from singa.errors import ConfigError
from singa.initializations import get_init_values
from singa.naming import enumInitMethod, generate_name, setval
from singa.proto import job_pb2

__all__ = ["Parameter", "set_param_field"]

INITS = ('uniform', 'gaussian', 'constant', 'none')


class Parameter:
    """A ParamProto `param` for a layer's `w_param` / `b_param`.

    Keywords: `name` (else `param<n>`; a layer renames it `w<layer>` / `b<layer>`), `lr` and
    `wd` (lr_scale and wd_scale, default 1), `init` ('uniform' ±`scale` 0.05 or `low`/`high`;
    'gaussian' `mean` 0 and `std` 0.01; 'constant' `value` 0; 'none': no init, for params that
    are loaded or shared; without `init`: kUniform with the proto's bounds [-1, 1]),
    `share_from`, and `level` for RBM stacks (name + level, then + '2' for a bias:
    `Parameter(name='b', level=1)` is `b12`, the hidden bias of the first RBM).

    One Parameter may serve several layers. As in SINGA, a layer's keyword shortcuts
    (`b_lr=2`, `w_std=0.1`) stay with it for the next layer (cifar10_cnn_parameter.py relies
    on this), but the name a layer gives it goes to that layer's copy only: SINGA kept the
    first layer's name, so the layers of mnist_mlp_parameter.py all had params named `w1`.
    """

    def __init__(self, **kwargs):
        self.param = job_pb2.ParamProto(lr_scale=kwargs.get('lr', 1), wd_scale=kwargs.get('wd', 1))
        if 'name' in kwargs:
            name = kwargs['name']
            if 'level' in kwargs:
                name += str(kwargs['level'])
                if name[0] == 'b':
                    name += '2'
            self.param.name = name
        else:
            self.param.name = generate_name('param', 1)
        if 'share_from' in kwargs:
            self.param.share_from = kwargs['share_from']
        init = kwargs.get('init')
        if init is None:
            self.param.init.type = job_pb2.kUniform
        elif init not in INITS:
            raise ConfigError(f"Parameter: init must be one of {', '.join(INITS)}, got {init!r}")
        elif init != 'none':
            self.param.init.type = enumInitMethod(init)
            setval(self.param.init, **get_init_values(init, **kwargs))

    def update(self, **fields):
        """Set ParamProto fields and init fields by keyword: `update(std=0.01)`."""
        setval(self.param, **fields)
        setval(self.param.init, **fields)


def set_param_field(param, pname, changename=False, withnumber=True, **kwargs):
    """Apply a layer's keyword shortcuts for its weight (`pname` 'w') or bias ('b') to ParamProto
    `param`: `<pname>_lr` → lr_scale, `<pname>_wd` → wd_scale, any other `<pname>_<field>` →
    init.<field> (`w_std=0.1`). The param is named `generate_name(pname [+ level],
    withnumber=withnumber)` when `changename` or while its name is a generated `param<n>`.
    """
    if pname not in ('w', 'b'):
        raise ConfigError(f"set_param_field: pname must be 'w' or 'b', got {pname!r}")
    prefix = pname + '_'
    lr = kwargs.get(prefix + 'lr', param.lr_scale)
    wd = kwargs.get(prefix + 'wd', param.wd_scale)
    init = {key[2:]: val for key, val in kwargs.items()
            if key.startswith(prefix) and key not in (prefix + 'lr', prefix + 'wd')}
    if changename or param.name.startswith('param'):
        label = pname + str(kwargs['level']) if 'level' in kwargs else pname
        param.name = generate_name(label, withnumber=withnumber)
    param.lr_scale, param.wd_scale = lr, wd
    setval(param.init, **init)
